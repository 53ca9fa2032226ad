"""The README's "Using it" walkthrough, run as written against a live service, so it cannot rot."""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from service.app import create_app
from service.cluster.local_ray import LocalRayCluster
from service.cluster.ray_jobs import RayJobs
from tests.conftest import make_settings
from tests.live import ServerThread

README = Path(__file__).resolve().parents[1] / "README.md"

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def using_it() -> tuple[str, str]:
    """The bash and the Python block of the "Using it" section."""
    text = README.read_text()
    section = text[text.index("## Using it") :]
    section = section[: section.index("\n## ", 1)]
    bash = re.search(r"```bash\n(.*?)```", section, re.S)
    python = re.search(r"```python\n(.*?)```", section, re.S)
    assert bash and python
    return bash.group(1), python.group(1)


def test_the_readme_walkthrough_runs_as_written(
    ray_cluster: LocalRayCluster, ray: RayJobs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bash, python = using_it()
    settings = make_settings(f"sqlite:///{tmp_path}/readme.db", ray_cluster.address)
    with ServerThread(create_app(settings)) as url:
        host = url.removeprefix("http://")
        env = os.environ | {
            "RLRUN_URL": url,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            "COLUMNS": "120",
        }
        env.pop("RLRUN_TOKEN", None)
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", bash.replace("localhost:8000", host)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=400,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert "SUCCEEDED" in done.stdout
        assert (tmp_path / "submit.sh").read_text().startswith("#!/usr/bin/env bash")
        assert "event: end" in done.stdout

        monkeypatch.setenv("RLRUN_URL", url)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(python, "README.md", "exec"), {})
        lines = out.getvalue().splitlines()
        assert lines[-1] == "SUCCEEDED" and len(lines) > 2

"""A spec's files cannot stand in for the launcher, verl or Ray: they land in ``run-files/``
of the job's working directory (on no import path), and the launcher starts with neither the
working directory nor the user's site-packages on its path, so its checks always run first."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import packaging
import pytest
from fastapi.testclient import TestClient

from jobs.verl_launch import HANDOVER, PREFIX
from service.recipes.verl.preflight import LAUNCHER
from tests.test_verl_launch import SMALL, finished, service

ROOT = Path(__file__).resolve().parents[1]
SHADOWS = ("jobs.py", "sitecustomize.py", "usercustomize.py", "verl.py", "ray.py")


def shadow(marks: Path, name: str) -> str:
    """A module that leaves a mark and fails loudly if it ever runs."""
    mark = marks / name.replace("/", "-")
    return (
        f"import pathlib\npathlib.Path({str(mark)!r}).write_text('ran')\n"
        f"raise SystemExit('rlrun test: the shipped {name} ran')\n"
    )


def _launch(cwd: Path, env: dict[str, str], python: str) -> subprocess.CompletedProcess[str]:
    argv = [python, *LAUNCHER[1:], "--no-plan"]  # the launcher's own usage error, nothing else
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


def test_the_launcher_starts_without_its_working_dir_or_user_site_on_the_path(
    tmp_path: Path,
) -> None:
    marks, cwd, user_base = tmp_path / "marks", tmp_path / "cwd", tmp_path / "user"
    marks.mkdir()
    (cwd / "jobs").mkdir(parents=True)
    (cwd / "jobs" / "__init__.py").write_text(shadow(marks, "jobs/__init__.py"))
    for name in SHADOWS:
        (cwd / name).write_text(shadow(marks, name))
    # A base interpreter (a venv turns the user site off by itself), its user site planted with
    # a usercustomize as an earlier job of the same Unix user could.
    python = getattr(sys, "_base_executable", sys.executable)
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "PYTHONUSERBASE": str(user_base),
        "PYTHONPATH": f"{ROOT}{os.pathsep}{Path(packaging.__file__).parents[1]}",
    }
    site = subprocess.run(
        [python, "-c", "import site; print(site.getusersitepackages(), site.ENABLE_USER_SITE)"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert site[1] == "True"
    Path(site[0]).mkdir(parents=True)
    (Path(site[0]) / "usercustomize.py").write_text(shadow(marks, "user-site usercustomize.py"))
    done = _launch(cwd, env, python)
    assert "usage: python3 -m jobs.verl_launch" in done.stderr, done.stderr
    assert sorted(p.name for p in marks.iterdir()) == []


@pytest.mark.ray
@pytest.mark.slow
def test_shipped_files_named_like_modules_never_run_before_the_launchers_checks(
    service_factory: Callable[..., TestClient], tmp_path: Path
) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    files = {name: shadow(marks, name) for name in SHADOWS}
    files["reward.py"] = "def compute_score(*args, **kwargs):\n    return 0.0\n"
    body = {**SMALL, "files": files, "overrides": ["custom_reward_function.path=reward.py"]}
    with service(service_factory, f"sqlite:///{tmp_path}/db.sqlite", tmp_path) as client:
        nested = client.post("/runs", json={**body, "files": {"jobs/__init__.py": "x"}})
        assert nested.status_code == 422, nested.text
        assert nested.json()["errors"][0]["field"].startswith("files"), nested.json()
        run_id = client.post("/runs", json=body).json()["id"]
        run = finished(client, run_id)
        log = client.get(f"/runs/{run_id}/logs").text
    assert sorted(p.name for p in marks.iterdir()) == [], log[-3000:]
    assert "the shipped" not in log
    # The launcher's checks ran on every node, the shipped file found at its place ...
    assert run["preflight"]["ok"] is True and len(run["preflight"]["nodes"]) == 2
    assert log.index(PREFIX) < log.index(HANDOVER)
    for node in run["preflight"]["nodes"]:
        (reward,) = [c for c in node["checks"] if c["key"] == "custom_reward_function.path"]
        assert reward["target"] == "run-files/reward.py" and reward["ok"] is True
    assert "custom_reward_function.path=run-files/reward.py" in run["command"]
    # ... then verl itself (not the shipped verl.py) started and failed in its own code.
    after = log[log.index(HANDOVER) :]
    verl_frame = re.search(r'File "[^"]*/site-packages/verl/', after)
    assert "Traceback" in after and verl_frame, after[-3000:]
    assert run["status"] == "FAILED"

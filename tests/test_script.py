"""``GET /runs/{id}/script``: valid bash that submits the stored job with the same argv, inert to
shell metacharacters in anything a user typed."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

import jobs
from service.loops.submitter import CLUSTER_EVENTS_OFF

PRESET = {"recipe": "verl-fully-async", "preset": "geo3k-qwen3vl-8b-npu"}
# A stand-in `ray` that records the arguments it was called with as JSON.
FAKE_RAY = """#!/usr/bin/env python3
import json, os, sys
with open(os.environ["RAY_ARGS_OUT"], "w") as f:
    json.dump(sys.argv[1:], f)
"""


def script_of(api: TestClient, body: dict[str, Any]) -> tuple[dict[str, Any], str]:
    resp = api.post("/runs", json=body)
    assert resp.status_code == 201, resp.text
    run = api.get(f"/runs/{resp.json()['id']}").json()
    script = api.get(f"/runs/{run['id']}/script")
    assert script.status_code == 200
    assert script.headers["content-type"].startswith("text/x-shellscript")
    return run, script.text


def run_with_fake_ray(script: str, tmp_path: Path) -> list[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ray").write_text(FAKE_RAY)
    (bin_dir / "ray").chmod(0o755)
    (tmp_path / "run.sh").write_text(script)
    out = tmp_path / "args.json"
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "RAY_ARGS_OUT": str(out),
        "PYTHONPATH": str(Path(jobs.__file__).parent.parent),
    }
    subprocess.run(["bash", str(tmp_path / "run.sh")], env=env, check=True, timeout=60)
    args: list[str] = json.loads(out.read_text())
    return args


def test_script_is_valid_bash_and_submits_the_same_job(api: TestClient, tmp_path: Path) -> None:
    run, script = script_of(api, {**PRESET, "name": "geo3k"})
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    args = run_with_fake_ray(script, tmp_path)
    assert args[:2] == ["job", "submit"]
    cut = args.index("--")
    assert args[cut + 1 :] == run["command"]
    options = dict(zip(args[2:cut:2], args[3:cut:2], strict=True))
    assert options["--submission-id"] == run["id"]
    runtime_env = json.loads(options["--runtime-env-json"])
    # As the submitter sends them: the run's env vars and Ray's scheduler events off.
    assert runtime_env["env_vars"] == run["runtime_env"]["env_vars"] | CLUSTER_EVENTS_OFF
    assert runtime_env["py_modules"] == [str(Path(jobs.__file__).parent)]


def test_shell_metacharacters_in_the_spec_run_nothing(api: TestClient, tmp_path: Path) -> None:
    marker = Path(f"/tmp/pwned-{uuid.uuid4().hex}")
    evil = f"x; touch {marker} $(touch {marker}) `touch {marker}` '\"\n"
    body = {
        **PRESET,
        "name": evil.strip(),  # a name is one line
        "trainer": {"experiment_name": evil, "project_name": evil},
        "data": {"train_files": "/data/" + evil},  # under a data root: only its text is odd
        "runtime_env": {"env_vars": {"EVIL": evil}},
    }
    run, script = script_of(api, body)
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    args = run_with_fake_ray(script, tmp_path)
    assert not marker.exists()
    assert args[args.index("--") + 1 :] == run["command"]
    options = dict(zip(args[2 : args.index("--") : 2], args[3 : args.index("--") : 2], strict=True))
    assert json.loads(options["--runtime-env-json"])["env_vars"]["EVIL"] == evil


def test_script_of_an_unknown_run_is_a_404(api: TestClient) -> None:
    assert api.get("/runs/nope/script").status_code == 404


def test_script_works_for_any_recipe(api: TestClient, tmp_path: Path) -> None:
    run, script = script_of(api, {"recipe": "test-script", "message": "it's $HOME", "npus": 2})
    args = run_with_fake_ray(script, tmp_path)
    cut = args.index("--")
    assert args[cut + 1 :] == run["command"]  # a multi-line `python3 -c` program, intact
    options = dict(zip(args[2:cut:2], args[3:cut:2], strict=True))
    assert json.loads(options["--entrypoint-resources"]) == {"NPU": 2.0}
    assert options["--entrypoint-num-cpus"] == "0.1"


def test_the_runs_files_travel_with_the_script_as_its_working_dir(
    api: TestClient, tmp_path: Path
) -> None:
    reward = "def compute_score(*a, **k):\n    return 1.0  # it's $(not run) `either`\n"
    body = {
        **PRESET,
        "files": {"reward.py": reward},
        "overrides": ["custom_reward_function.path=reward.py"],
    }
    run, script = script_of(api, body)
    args = run_with_fake_ray(script, tmp_path)
    cut = args.index("--")
    options = dict(zip(args[2:cut:2], args[3:cut:2], strict=True))
    working_dir = Path(json.loads(options["--runtime-env-json"])["working_dir"])
    assert (working_dir / "run-files" / "reward.py").read_text() == reward
    assert args[cut + 1 :] == run["command"]

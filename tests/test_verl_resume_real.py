"""A real verl run carried over a SIGKILL by verl's own checkpoints: cpu-smoke (verl's fully
async trainer on CPU) on a service and embedded Ray head of its own, its ``FullyAsyncTrainer``
actor's process SIGKILLed once verl has written a complete checkpoint (its tracker names a
``global_step_N`` written to the end). The run's retry policy starts attempt 2, which resumes
from that checkpoint (``resume_mode=auto``: verl's own tracker) and succeeds; the reward series
goes on with no step twice.

Its own run, not the session's shared one (``tests/verl_run.py``), which must not be killed:
two verl start-ups, 13.4 minutes from start to end on two cores loaded 10-18-fold by other
work. One file, so CI can select or leave it alone. It asks for the session's verl lock
(``verl_lock``: taken at collection, before its timeout starts). Slow, and it needs the
trainer stack (rlrun[verl-cpu], README): without it the test fails, never skips.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from jobs.verl_launch import resume
from service.cluster.ray_jobs import RayJobs
from service.metrics.keys import REWARD_KEY, STEP_KEY
from tests.conftest import RAY_PORT
from tests.verl_run import RAY_DIR, own_service, wait_end

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.timeout(1500, func_only=True)]

SYNCS = 4  # one more than the shared run's: the kill lands after a save with syncs still to go
SPEC: dict[str, Any] = {
    "recipe": "verl-fully-async",
    "preset": "cpu-smoke",
    "name": "cpu-smoke-resume",
    "rollout": {"total_rollout_steps": 4 * SYNCS},
    "retry": {"max_attempts": 2, "on": ["actor_died"], "backoff_s": 0},
}
# The head's and dashboard's ports (offsets from RAY_PORT): beside the shared run's, and none a
# Ray-lane test uses.
PORTS = (1700, 1800)
TRAINER = "FullyAsyncTrainer"
RUN_TIMEOUT_S = 1200


def _wait(what: str, check: Any, timeout: float, every: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if got := check():
            return got
        time.sleep(every)
    raise AssertionError(f"{what}: not within {timeout:g} s")


def _saved(tree: Path) -> int | None:
    """The step verl's tracker names, once that step's directory is complete."""
    step = resume.tracker_step(tree)
    return step if step and resume.complete(tree / f"global_step_{step}") else None


def _series(http: httpx.Client, run_id: str, key: str) -> list[tuple[int, float]]:
    answer = http.get(f"/runs/{run_id}/metrics", params={"keys": key, "max_points": 1000})
    return [(p["step"], p["value"]) for p in answer.json()["series"].get(key, [])]


def test_a_sigkilled_trainer_resumes_from_verls_own_checkpoint(verl_lock: None) -> None:
    started = time.monotonic()
    with (
        own_service("rlrun-verl-resume-", PORTS) as (root, service),
        httpx.Client(base_url=service.url, timeout=30) as http,
    ):
        token = (root / RAY_DIR / "ray-token").read_text().strip()
        ray = RayJobs(f"http://127.0.0.1:{RAY_PORT + PORTS[1]}", token)
        resp = http.post("/runs", json=SPEC)
        assert resp.status_code == 201, resp.text
        run_id = resp.json()["id"]
        tree = root / "checkpoints" / run_id
        (trainer,) = _wait(
            "verl's trainer actor",
            lambda: ray.state("actors", "ALIVE", class_name=TRAINER),
            RUN_TIMEOUT_S,
        )
        saved = _wait("verl's first checkpoint", lambda: _saved(tree), RUN_TIMEOUT_S, 0.1)
        os.kill(int(trainer["pid"]), signal.SIGKILL)
        print(f"\nkilled {TRAINER} pid {trainer['pid']} once global_step_{saved} was saved")
        run = wait_end(http, run_id, RUN_TIMEOUT_S)
        seconds = time.monotonic() - started
        print(f"the run {run_id}: {run['status']} in {seconds:.0f} s")
        (root / "run.json").write_text(json.dumps(run, indent=2))
        if run["status"] != "SUCCEEDED" or len(run["attempts"]) != 2:
            print(json.dumps({k: run.get(k) for k in ("attempts", "events", "failure")})[:20_000])
            print(http.get(f"/runs/{run_id}/logs", params={"tail": 300}).text[-30_000:])
        assert run["status"] == "SUCCEEDED", run["status"]
        first, second = run["attempts"]
        assert (first["status"], first["failure"]["class"]) == ("FAILED", "actor_died"), first
        resumed = second["resumed_from_step"]
        assert saved <= resumed < SYNCS, (saved, second)
        log = ray.logs(f"{run_id}-a2") or ""
        assert f"Load from checkpoint folder: {tree}/global_step_{resumed}" in log
        rewards = _series(http, run_id, REWARD_KEY)
        versions = _series(http, run_id, STEP_KEY)
        print("rewards", rewards, "versions", versions)
        # One series, no step twice, on to the last step line (verl's last step's own
        # figures are never printed; those of the step the kill cut short are lost, #7933).
        steps = [s for s, _ in rewards]
        assert steps and steps == sorted(set(steps)) and steps[-1] == SYNCS, rewards
        assert versions == [(v, float(v)) for v in range(SYNCS + 1)], versions
        assert run["progress"]["step"] == SYNCS, run["progress"]
        assert resume.tracker_step(tree) == SYNCS
        ray.close()

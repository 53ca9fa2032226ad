"""One real verl run through every way an attempt ends early, as the attempts of one run: a
low-priority cpu-smoke run (verl's fully async trainer on CPU, a checkpoint every sync) fills
the 2 NPU slots of a service and embedded Ray head of its own, with preemption on and a retry
policy for a dead actor.

1. **Preempted.** Once it has saved, a high-priority tiny-grpo run that needs both slots
   arrives: the service asks the verl run to stop at its next complete checkpoint (no step
   lost); the high run starts and succeeds.
2. **Killed.** Attempt 2 resumes from the newest save attempt 1 made (verl's own resume); once
   it has saved again, its ``FullyAsyncTrainer`` actor is SIGKILLed: the attempt fails as
   ``actor_died`` and the retry policy starts attempt 3.
3. **Resumed.** Attempt 3 resumes from the newest complete save and succeeds.

One history across the three: every parameter version once, the reward figures never twice.
Three verl start-ups for what two runs of two start-ups each proved before. Its own run, not the
session's shared one (``tests/verl_run.py``), which must not be disturbed; it asks for the
session's verl lock. Slow, and it needs the trainer stack (rlrun[verl-cpu], README): without it
the test fails, never skips. The preemption scenario's figures are the benchmark's
(``tests/benchmarks/bench_preemption.py --verl``).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any
from unittest.mock import patch

import httpx
import pytest

from jobs.verl_launch import resume
from service.cluster.ray_jobs import RayJobs
from service.metrics.keys import REWARD_KEY, STEP_KEY
from tests.benchmarks.bench_preemption import high_spec, preemption_env, verl_low_spec
from tests.conftest import RAY_PORT
from tests.verl_resume_check import assert_resumed_where_said
from tests.verl_run import RAY_DIR, TERMINAL, own_service, wait_end

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.timeout(2400, func_only=True)]

SYNCS = 40  # a step is ~0.3 s (more when loaded): a stop and a kill each land with syncs to go
GRACE_S = 300.0
# The head's and dashboard's ports (offsets from RAY_PORT): beside the other verl runs', and none
# a Ray-lane test uses.
PORTS = (2100, 2200)
TRAINER = "FullyAsyncTrainer"
WAIT_S = 1200.0
SPEC: dict[str, Any] = verl_low_spec(SYNCS) | {
    "name": "verl-lifecycle",
    "retry": {"max_attempts": 3, "on": ["actor_died"], "backoff_s": 0},
}


def _wait(what: str, check: Callable[[], Any], timeout: float = WAIT_S, every: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if got := check():
            return got
        time.sleep(every)
    raise AssertionError(f"{what}: not within {timeout:g} s")


def _finished(tree: Path) -> dict[int, float]:
    """Each complete verl save under ``tree``: when it was finished (its rollouter's data.pt,
    written last), in epoch seconds."""
    return {step: (path / "data.pt").stat().st_mtime for step, path in resume.completes(tree)}


def _series(http: httpx.Client, run_id: str, key: str) -> list[tuple[int, float]]:
    answer = http.get(f"/runs/{run_id}/metrics", params={"keys": key, "max_points": 1000})
    return [(p["step"], p["value"]) for p in answer.json()["series"].get(key, [])]


def _epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _run(http: httpx.Client, run_id: str) -> dict[str, Any]:
    return http.get(f"/runs/{run_id}").json()  # type: ignore[no-any-return]


def test_a_verl_run_preempted_then_killed_resumes_each_time_with_one_history(
    verl_lock: None,
) -> None:
    started = time.monotonic()
    with (
        patch.dict(os.environ, preemption_env(GRACE_S)),
        own_service("rlrun-life-", PORTS) as (root, service),
        httpx.Client(base_url=service.url, timeout=30) as http,
    ):
        token = (root / RAY_DIR / "ray-token").read_text().strip()
        ray = RayJobs(f"http://127.0.0.1:{RAY_PORT + PORTS[1]}", token)
        tree = root / "checkpoints"
        resp = http.post("/runs", json=SPEC)
        assert resp.status_code == 201, resp.text
        run_id = resp.json()["id"]
        tree = tree / run_id
        try:
            _scenario(http, ray, run_id, tree, started)
        except AssertionError:
            run = _run(http, run_id)
            print(json.dumps({k: run.get(k) for k in ("attempts", "events", "failure")})[:20_000])
            print(http.get(f"/runs/{run_id}/logs", params={"tail": 300}).text[-30_000:])
            raise
        finally:
            ray.close()


def _scenario(http: httpx.Client, ray: RayJobs, run_id: str, tree: Path, started: float) -> None:
    # 1. Preempted: once it runs and has saved, a high run that needs its room arrives.
    _wait("a save of attempt 1", lambda: (r := _run(http, run_id))["status"] == "RUNNING"
          and r["checkpoint"])  # fmt: skip
    asked = time.monotonic()
    high = http.post("/runs", json=high_spec(1, npus=1)).json()["id"]
    _wait("the high run's start", lambda: _run(http, high)["status"] == "RUNNING", 600)
    print(f"\nhigh run RUNNING {time.monotonic() - asked:.1f} s after its submit")
    ended = _wait("the high run's end", lambda: (r := _run(http, high))["status"] in TERMINAL
                  and r)  # fmt: skip
    assert ended["status"] == "SUCCEEDED", ended["status"]
    run = _run(http, run_id)
    preempted = [e["reason"] for e in run["events"] if e["kind"] == "preempted"]
    assert preempted and preempted[0].startswith(f"preempted for run {high} (high)"), preempted
    stop = next(e["reason"] for e in run["events"] if "steps lost" in e["reason"])
    assert ", 0 steps lost" in stop, stop

    # 2. Killed: attempt 2 runs, resumed; once it has saved past its resume point, its
    # trainer dies.
    def saved_again() -> int | None:
        run = _run(http, run_id)
        resumed = run["attempts"][-1].get("resumed_from_step") if run["attempt"] == 2 else None
        newest = resume.tracker_step(tree)
        ok = resumed is not None and newest is not None and newest > resumed
        return newest if ok and resume.complete(tree / f"global_step_{newest}") else None

    killed_after = _wait("a save of attempt 2 past its resume point", saved_again)
    (trainer,) = _wait(
        "attempt 2's trainer actor", lambda: ray.state("actors", "ALIVE", class_name=TRAINER)
    )
    os.kill(int(trainer["pid"]), signal.SIGKILL)
    print(f"killed {TRAINER} pid {trainer['pid']} once global_step_{killed_after} was saved")

    # 3. Resumed: attempt 3 runs to the end.
    run = wait_end(http, run_id, WAIT_S)
    print(f"the run {run_id}: {run['status']} in {time.monotonic() - started:.0f} s")
    assert run["status"] == "SUCCEEDED" and run["attempt"] == 3, run["attempts"]
    first, second, third = run["attempts"]
    assert second["status"] == "FAILED" and second["failure"]["class"] == "actor_died", second

    # Each attempt resumed from the newest complete save of the one before: attempt 2 from the
    # one attempt 1 stopped at (or one its job made while Ray stopped it), attempt 3 from the
    # one attempt 2 made before it was killed (or a later one, made before it died).
    saves = _finished(tree)
    for before, after in ((first, second), (second, third)):
        made = [s for s, at in saves.items() if at < _epoch(before["ended_at"])]
        assert after["resumed_from_step"] == made[-1], (before, after, saves)
    assert third["resumed_from_step"] >= killed_after, third
    log = ray.logs(f"{run_id}-a3") or ""
    assert f"Load from checkpoint folder: {tree}/global_step_{third['resumed_from_step']}" in log
    # Each resume checked after the fact (verl's loaded checkpoint, version, data position and
    # first sync) as the service checks it: neither attempt read resume_mismatch.
    assert_resumed_where_said(log, third["resumed_from_step"])
    assert_resumed_where_said(ray.logs(f"{run_id}-a2") or "", second["resumed_from_step"])
    assert run["health"]["status"] == "ok", run["health"]

    # One history, no step twice: every parameter version once; the reward figures but those
    # verl had not printed when an attempt ended (a step's come one sync late, and verl prints
    # none at the first sync of a start, #7933).
    versions = _series(http, run_id, STEP_KEY)
    assert versions == [(v, float(v)) for v in range(SYNCS + 1)], versions
    steps = [s for s, _ in _series(http, run_id, REWARD_KEY)]
    assert steps == sorted(set(steps)) and steps[-1] == SYNCS, steps
    lost = set(range(2, SYNCS + 1)) - set(steps)
    resumed = {second["resumed_from_step"], third["resumed_from_step"]}
    assert lost <= {s + d for s in resumed for d in (0, 1)}, (lost, resumed)
    assert run["progress"]["step"] == SYNCS and resume.tracker_step(tree) == SYNCS

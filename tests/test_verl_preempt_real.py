"""Preemption for priority of a real verl run: a low-priority cpu-smoke run (verl's fully async
trainer on CPU, a checkpoint every sync) fills the 2 NPU slots of a service and embedded Ray head
of its own; once it has saved, a high-priority tiny-grpo run that needs both slots arrives. The
service preempts the verl run, which stops at its next complete checkpoint (no step lost), comes
back as attempt 2 of the same run, resumes from its newest save (verl's own resume) and succeeds
with one history, no step twice (every parameter version; the reward figures but those verl had
not printed when attempt 1 stopped); the high run succeeds.

The scenario is the benchmark's (``tests/benchmarks/bench_preemption.py --verl``, its figures).
Its own run, not the session's shared one (``tests/verl_run.py``), which must not be preempted:
two verl start-ups (the victim's attempts), 11 minutes on a 2-core host. It asks for the
session's verl lock (``verl_lock``: taken at collection, before its timeout starts). Slow, and
it needs the trainer stack (rlrun[verl-cpu], README): without it the test fails, never skips.
"""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from jobs.verl_launch import resume
from service.metrics.keys import STEP_KEY
from tests.benchmarks.bench_preemption import VERL_SYNCS, report, verl_preempted
from tests.benchmarks.report import Report

pytestmark = [
    pytest.mark.slow,
    pytest.mark.ray,
    pytest.mark.extra,
    pytest.mark.timeout(1800, func_only=True),
]

GRACE_S = 300.0
# The head's and dashboard's ports (offsets from RAY_PORT): beside the other verl runs', and none
# a Ray-lane test uses.
PORTS = (2100, 2200)


def _finished(tree: Path) -> dict[int, float]:
    """Each complete verl save under ``tree``: when it was finished (its rollouter's data.pt,
    written last), in epoch seconds."""
    return {step: (path / "data.pt").stat().st_mtime for step, path in resume.completes(tree)}


def _steps(http: httpx.Client, run_id: str, key: str) -> list[int]:
    answer = http.get(f"/runs/{run_id}/metrics", params={"keys": key, "max_points": 1000})
    return [p["step"] for p in answer.json()["series"].get(key, [])]


def _epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _diagnose(http: httpx.Client, victim: dict[str, Any]) -> None:
    print(json.dumps({k: victim.get(k) for k in ("attempts", "events")})[:20_000])
    print(http.get(f"/runs/{victim['id']}/logs", params={"tail": 300}).text[-30_000:])


def test_a_preempted_verl_run_stops_at_its_checkpoint_and_resumes_from_it(
    verl_lock: None,
) -> None:
    started = time.monotonic()
    with verl_preempted(PORTS, VERL_SYNCS, GRACE_S) as (out, http, root):
        report(out, GRACE_S, Report("preemption of a verl run"), needs="both NPU slots")
        print(f"the scenario took {time.monotonic() - started:.0f} s")
        (victim_id,) = out.lows
        victim = http.get(f"/runs/{victim_id}").json()
        if victim["status"] != "SUCCEEDED" or victim_id not in out.victims:
            _diagnose(http, victim)
        high = out.high["id"]
        assert out.high["status"] == "SUCCEEDED", out.high["status"]
        assert victim_id in out.victims, out.events[victim_id]

        preempted = [e["reason"] for e in victim["events"] if e["kind"] == "preempted"]
        assert preempted and preempted[0].startswith(f"preempted for run {high} (high)")
        assert out.lost[victim_id] == 0, out.events[victim_id]

        # Attempt 2 resumed from the newest complete save attempt 1 made: the one it stopped
        # at, or one its job made while Ray stopped it (each save past it is attempt 2's).
        assert victim["status"] == "SUCCEEDED" and victim["attempt"] == 2, victim["attempts"]
        first, second = victim["attempts"]
        resumed = second["resumed_from_step"]
        saved = out.saved_at[victim_id]
        assert saved is not None and saved <= resumed < VERL_SYNCS, (saved, resumed)
        ended = _epoch(first["ended_at"])
        finished = _finished(root / "checkpoints" / victim_id)
        assert [s for s, at in finished.items() if at < ended][-1] == resumed, finished
        assert all(at > ended for s, at in finished.items() if s > resumed), finished

        # One history, every step once: each parameter version synced; the reward figures all
        # but those verl had not printed when attempt 1 stopped (a step's come one sync late,
        # and verl prints none at the first sync of a start, #7933).
        assert _steps(http, victim_id, STEP_KEY) == list(range(VERL_SYNCS + 1))
        rewards = out.steps[victim_id]
        missing = set(range(2, VERL_SYNCS + 1)) - set(rewards)
        assert rewards == sorted(set(rewards)) and rewards[-1] == VERL_SYNCS, rewards
        assert resumed + 1 in missing <= {resumed, resumed + 1}, rewards

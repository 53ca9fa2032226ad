"""verl learns under rlrun: one ``cpu-learn`` run (verl's own fully async GRPO on CPU, the seed's
recipe in miniature) from POST /runs to its end on a service and embedded head of its own; its
reward per sync, the wall time, the time to its first sync, and each sync's digests::

    PYTHONPATH=$PWD .venv/bin/python -m tests.benchmarks.bench_learning [--quick]

The bounds (``WINDOW``, ``RISE``, ``FLOOR``): the mean ``critic/score/mean`` of the last 5 syncs
at least 0.25 above the first 5 and at least 0.6. The run is compared with the curve pinned
from one such run (``tests/data/cpu_learn_baseline.json``: its reward per sync).

``--quick`` (what CI runs, no verl): the report of the pinned curve against itself, so the
report's code cannot rot; the real run's own check is ``tests/test_verl_learns_real.py``.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import time
from pathlib import Path
from statistics import mean
from typing import Any

import httpx

from service.metrics.keys import REWARD_KEY
from tests.benchmarks.report import Report

WINDOW, RISE, FLOOR = 5, 0.25, 0.6
BASELINE = Path(__file__).resolve().parents[1] / "data" / "cpu_learn_baseline.json"
# The benchmark's service's head and dashboard ports (offsets from RAY_PORT).
PORTS = (2300, 2400)


def rise(rewards: list[float]) -> tuple[float, float]:
    """The mean reward of the first and of the last ``WINDOW`` syncs."""
    return mean(rewards[:WINDOW]), mean(rewards[-WINDOW:])


def learned(rewards: list[float]) -> bool:
    first, last = rise(rewards)
    return len(rewards) >= 2 * WINDOW and last >= first + RISE and last >= FLOOR


def baseline() -> dict[str, Any]:
    pinned: dict[str, Any] = json.loads(BASELINE.read_text())
    return pinned


def curve(http: httpx.Client, run_id: str) -> list[tuple[int, float]]:
    answer = http.get(f"/runs/{run_id}/metrics", params={"keys": REWARD_KEY, "max_points": 10_000})
    return [(p["step"], p["value"]) for p in answer.json()["series"].get(REWARD_KEY, [])]


def report(rep: Report, rewards: list[float], against: list[float]) -> None:
    first, last = rise(rewards)
    rep.add("syncs with a reward", str(len(rewards)))
    rep.add(f"mean reward, first {WINDOW} syncs", f"{first:.3f}")
    rep.add(f"mean reward, last {WINDOW} syncs", f"{last:.3f}")
    verdict = "learned" if learned(rewards) else "DID NOT LEARN"
    rep.add("bounds", f"last >= first + {RISE:g} and last >= {FLOOR:g}: {verdict}")
    pinned = rise(against)[1]
    rep.add("last 5 vs the pinned run's", f"{last - pinned:+.3f} (pinned {pinned:.3f})")
    per = ", ".join(f"{v:.2f}" for v in rewards)
    rep.add("reward per sync", per)


def real(rep: Report) -> None:
    from tests.verl_run import LOCK, own_service, wait_end

    with LOCK.open("w") as lock:
        print(f"waiting for the verl lock {LOCK} ...", flush=True)
        fcntl.flock(lock, fcntl.LOCK_EX)
        with (
            own_service("rlrun-bench-learn-", PORTS, learn=True) as (_, service),
            httpx.Client(base_url=service.url, timeout=30) as http,
        ):
            started = time.monotonic()
            spec = {"recipe": "verl-fully-async", "preset": "cpu-learn", "name": "bench-learn"}
            run_id = http.post("/runs", json=spec).json()["id"]
            run = wait_end(http, run_id, 1800)
            wall = time.monotonic() - started
            rewards = [v for _, v in curve(http, run_id)]
            sync = run.get("weight_sync") or {}
    rep.add("run", f"{run_id}: {run['status']}, health {run['health']['status']}")
    rep.add("wall time, POST to end", f"{wall:.0f} s")
    rep.add("time to the first step", f"{run.get('time_to_first_step') or 0:.0f} s")
    newest = f"newest {sync.get('last_version')}: {str(sync.get('last_digest'))[:16]}..."
    rep.add("syncs proven by their digests", f"{sync.get('proven')} ({newest})")
    report(rep, rewards, baseline()["rewards"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="no verl: the pinned curve's report")
    args = parser.parse_args()
    rep = Report("verl learns under rlrun (cpu-learn)")
    if args.quick:
        pinned = baseline()["rewards"]
        report(rep, pinned, pinned)
    else:
        real(rep)
    rep.print()


if __name__ == "__main__":
    main()

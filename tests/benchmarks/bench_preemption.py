"""Preemption for priority on a real Ray head with tiny-grpo: low-priority runs fill the cluster,
a high-priority run is submitted, the service preempts the runs that lose the least.

    python -m tests.benchmarks.bench_preemption [--port 4600] [--grace 60] [--quick]

Printed: the time from the high run's submit to its start (RUNNING), the steps each victim lost
(goal 0: its save interval, one parameter version, is far shorter than the grace), and whether
each victim came back as attempt 2, resumed from its checkpoint and finished with no step twice
in its one reward history. ``--quick``: shorter runs (what CI runs).
"""

from __future__ import annotations

import argparse
import re
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from fastapi.testclient import TestClient

from service.app import create_app
from service.metrics.keys import REWARD_KEY
from tests.benchmarks.report import Report, ray_head
from tests.conftest import make_settings

TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED", "CANCELLED", "LOST"}
_LOST = re.compile(r"stopped (?:at checkpoint step (\d+)|with no checkpoint), (\d+) steps lost")


def low_spec(name: str, versions: int) -> dict[str, Any]:
    """A low-priority tiny-grpo run on 4 + 4 NPUs that saves a checkpoint every version."""
    return {
        "recipe": "tiny-grpo",
        "name": name,
        "priority": "low",
        "trainer_npus": 4,
        "rollout_npus": 4,
        "total_rollout_steps": 16 * versions,
        "gen_seconds": 0.3,
        "save_every": 1,
    }


def high_spec(versions: int) -> dict[str, Any]:
    """A high-priority run on 8 + 8 NPUs: the whole cluster, so every low run must make room."""
    return low_spec("urgent", versions) | {
        "priority": "high",
        "save_every": 0,
        "trainer_npus": 8,
        "rollout_npus": 8,
    }


@dataclass
class Outcome:
    to_start_s: float
    high: dict[str, Any]
    victims: dict[str, dict[str, Any]] = field(default_factory=dict)
    lost: dict[str, int] = field(default_factory=dict)
    saved_at: dict[str, int | None] = field(default_factory=dict)
    steps: dict[str, list[int]] = field(default_factory=dict)
    events: dict[str, list[str]] = field(default_factory=dict)


def wait(client: TestClient, run_id: str, ok: Any, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        run: dict[str, Any] = client.get(f"/runs/{run_id}").json()
        if ok(run):
            return run
        if time.monotonic() > deadline:
            raise AssertionError(f"run {run_id} waited too long: {run['status']}")
        time.sleep(0.2)


def scenario(client: TestClient, low_versions: int, high_versions: int) -> Outcome:
    """Two low runs fill the two 8-NPU nodes; once each has saved a checkpoint, a high run that
    needs both nodes is submitted. Everything runs to its end; what each run went through is
    returned."""
    lows = [
        client.post("/runs", json=low_spec(f"low{i}", low_versions)).json()["id"] for i in (1, 2)
    ]
    deadline = time.monotonic() + 300
    while not all(
        (r := client.get(f"/runs/{i}").json())["status"] == "RUNNING" and r["checkpoint"]
        for i in lows
    ):
        assert time.monotonic() < deadline, "the low runs did not both run and save"
        time.sleep(0.2)
    submitted = time.monotonic()
    high_id = client.post("/runs", json=high_spec(high_versions)).json()["id"]
    wait(client, high_id, lambda r: r["status"] == "RUNNING", 300)
    out = Outcome(time.monotonic() - submitted, {})
    out.high = wait(client, high_id, lambda r: r["status"] in TERMINAL, 300)
    for run_id in lows:
        run = wait(client, run_id, lambda r: r["status"] in TERMINAL, 600)
        reasons = [e["reason"] for e in client.get(f"/runs/{run_id}").json()["events"]]
        out.events[run_id] = reasons
        series = client.get(f"/runs/{run_id}/metrics", params={"keys": REWARD_KEY}).json()
        out.steps[run_id] = [p["step"] for p in series["series"].get(REWARD_KEY, [])]
        if run["attempt"] > 1:
            out.victims[run_id] = run
            ended = next((m for r in reasons if (m := _LOST.search(r))), None)
            if ended is not None:
                out.lost[run_id] = int(ended.group(2))
                out.saved_at[run_id] = int(ended.group(1)) if ended.group(1) else None
    return out


def settings_for(address: str, db_url: str, grace_s: float) -> Any:
    return make_settings(
        db_url,
        address,
        preemption="on",
        preemption_grace_s=grace_s,
        preemption_min_admitted_s=2.0,
    )


def report(out: Outcome, grace_s: float, rep: Report) -> None:
    rep.add("high-priority submit -> RUNNING, cluster full of low runs", f"{out.to_start_s:.1f} s")
    rep.add("victims", f"{len(out.victims)} of 2 low runs (the high run needs all 16 NPUs)")
    for run_id, run in out.victims.items():
        steps = out.steps[run_id]
        once = len(steps) == len(set(steps)) and steps == sorted(steps)
        resumed = [a.get("resumed_from_step") for a in run["attempts"]]
        rep.add(
            f"victim {run['name']}",
            f"{out.lost.get(run_id, '?')} steps lost (grace {grace_s:g} s, a save every version), "
            f"stopped at checkpoint step {out.saved_at.get(run_id)}, attempt {run['attempt']} "
            f"resumed from step {resumed[-1]} (its newest save), ended {run['status']}; "
            f"{len(steps)} reward steps, {'no step twice' if once else 'A STEP TWICE'}",
        )
    rep.add("high run", f"ended {out.high['status']}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=4600)
    parser.add_argument("--grace", type=float, default=60.0)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    low_versions, high_versions = (12, 1) if args.quick else (80, 6)
    rep = Report("preemption")
    with ray_head([8, 8], 8, args.port) as address:
        db_url = f"sqlite:///{tempfile.mkdtemp()}/bench.db"
        with TestClient(create_app(settings_for(address, db_url, args.grace))) as client:
            out = scenario(client, low_versions, high_versions)
    report(out, args.grace, rep)
    rep.print()


if __name__ == "__main__":
    main()

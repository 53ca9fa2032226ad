"""Preemption for priority on a real Ray head: low-priority runs fill the cluster, a high-priority
run is submitted, the service preempts the runs that lose the least.

    python -m tests.benchmarks.bench_preemption [--port 4600] [--grace S] [--quick | --verl]

Printed: the time from the high run's submit to its start (RUNNING), the steps each victim lost
(goal 0: its save interval, one parameter version, is far shorter than the grace), and whether
each victim came back as attempt 2, resumed from its checkpoint and finished with no step twice
in its one reward history. The grace is 60 s (300 s with ``--verl``).

By default the victims are two tiny-grpo runs on a local head of two 8-NPU nodes; ``--quick``:
shorter runs (what CI runs). ``--verl``: the victim is verl's own fully async trainer (preset
``cpu-smoke`` of ``verl-fully-async``, a checkpoint every sync), alone on the 2 NPU slots of a
service and embedded head of its own (``tests.verl_run.own_service``, the head on ``--port``,
its dashboard on ``--port`` + 2000), and the high run a tiny-grpo run that needs both slots. It
takes the host's verl lock, and minutes: two verl start-ups (the victim's attempts 1 and 2).
``tests/test_verl_lifecycle_real.py`` runs the same scenario as the first of a run's attempts.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import re
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest.mock import patch

import httpx
from fastapi.testclient import TestClient

from service.app import create_app
from service.metrics.keys import REWARD_KEY
from tests.benchmarks.report import Report, ray_head
from tests.conftest import RAY_PORT, make_settings
from tests.verl_run import LOCK, own_service

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


def high_spec(versions: int, npus: int = 8) -> dict[str, Any]:
    """A high-priority tiny-grpo run on ``npus`` + ``npus`` NPUs (8 + 8: both nodes of the
    tiny-grpo head, so every low run must make room)."""
    return low_spec("urgent", versions) | {
        "priority": "high",
        "save_every": 0,
        "trainer_npus": npus,
        "rollout_npus": npus,
    }


# The verl victim's syncs: its stop, decided once its first save is seen, lands a few syncs on
# (the watcher's look, the loops', Ray's stop: 2 steps on a loaded 2-core host, more where
# steps are quicker), with syncs still to go. Its data (256 prompts, one epoch) must outlast
# a resume too: verl's rollouter resumes its data where its feeder had read ahead to.
VERL_SYNCS = 12
VERL_GRACE_S = 300.0


def verl_low_spec(syncs: int) -> dict[str, Any]:
    """A low-priority verl run, preset ``cpu-smoke``, of ``syncs`` parameter syncs: one trainer
    step and one checkpoint each (the preset's ``save_freq=1``), on 1 + 1 NPU slots."""
    return {
        "recipe": "verl-fully-async",
        "preset": "cpu-smoke",
        "name": "verl-low",
        "priority": "low",
        "rollout": {"total_rollout_steps": 4 * syncs},
    }


@dataclass(frozen=True)
class Waits:
    """How long the scenario waits, in seconds: for every low run to run and save, for the high
    run to start and then to end, and for each low run to end."""

    saved: float = 300.0
    high_start: float = 300.0
    high_end: float = 300.0
    end: float = 600.0


# A verl run's start-up on CPU is minutes, and its victim starts up twice.
VERL_WAITS = Waits(saved=900.0, high_start=600.0, high_end=300.0, end=1200.0)


Client = TestClient | httpx.Client


@dataclass
class Outcome:
    to_start_s: float
    high: dict[str, Any]
    lows: list[str] = field(default_factory=list)
    victims: dict[str, dict[str, Any]] = field(default_factory=dict)
    lost: dict[str, int] = field(default_factory=dict)
    saved_at: dict[str, int | None] = field(default_factory=dict)
    steps: dict[str, list[int]] = field(default_factory=dict)
    events: dict[str, list[str]] = field(default_factory=dict)


def wait(client: Client, run_id: str, ok: Any, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        run: dict[str, Any] = client.get(f"/runs/{run_id}").json()
        if ok(run):
            return run
        if time.monotonic() > deadline:
            raise AssertionError(f"run {run_id} waited too long: {run['status']}")
        time.sleep(0.2)


def scenario(client: Client, low_versions: int, high_versions: int) -> Outcome:
    """Two low tiny-grpo runs fill the two 8-NPU nodes; once each has saved a checkpoint, a high
    run that needs both nodes is submitted."""
    lows = [low_spec(f"low{i}", low_versions) for i in (1, 2)]
    return preempt(client, lows, high_spec(high_versions), Waits())


def preempt(
    client: Client, low_specs: Sequence[dict[str, Any]], high: dict[str, Any], waits: Waits
) -> Outcome:
    """The low runs are submitted; once each runs and has saved a checkpoint, the high run,
    which needs their room, is. Everything runs to its end; what each run went through is
    returned."""
    lows = [client.post("/runs", json=spec).json()["id"] for spec in low_specs]
    deadline = time.monotonic() + waits.saved
    while not all(
        (r := client.get(f"/runs/{i}").json())["status"] == "RUNNING" and r["checkpoint"]
        for i in lows
    ):
        assert time.monotonic() < deadline, "the low runs did not all run and save"
        time.sleep(0.2)
    submitted = time.monotonic()
    high_id = client.post("/runs", json=high).json()["id"]
    wait(client, high_id, lambda r: r["status"] == "RUNNING", waits.high_start)
    out = Outcome(time.monotonic() - submitted, {}, lows)
    out.high = wait(client, high_id, lambda r: r["status"] in TERMINAL, waits.high_end)
    for run_id in lows:
        run = wait(client, run_id, lambda r: r["status"] in TERMINAL, waits.end)
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


def preemption_env(grace_s: float) -> dict[str, str]:
    """A service process's settings for preemption with a grace of ``grace_s``, a run
    preemptible 2 s after its admission."""
    return {
        "RLRUN_PREEMPTION": "on",
        "RLRUN_PREEMPTION_GRACE_S": str(grace_s),
        "RLRUN_PREEMPTION_MIN_ADMITTED_S": "2",
    }


@contextmanager
def verl_preempted(
    ports: tuple[int, int], syncs: int, grace_s: float
) -> Iterator[tuple[Outcome, httpx.Client, Path]]:
    """The scenario with a verl victim: a low-priority ``cpu-smoke`` run of ``syncs`` syncs fills
    the 2 NPU slots of a service and embedded head of its own (``own_service`` on ``ports``,
    preemption on, grace ``grace_s``); once it has saved, a high-priority tiny-grpo run on
    1 + 1 NPUs arrives. Yields the outcome, a client of the service, still up, and its root
    (kept if the block fails). The caller holds the host's verl lock."""
    with (
        patch.dict(os.environ, preemption_env(grace_s)),
        own_service("rlrun-verl-preempt-", ports) as (root, service),
        httpx.Client(base_url=service.url, timeout=30) as http,
    ):
        yield preempt(http, [verl_low_spec(syncs)], high_spec(1, npus=1), VERL_WAITS), http, root


def settings_for(address: str, db_url: str, grace_s: float) -> Any:
    return make_settings(
        db_url,
        address,
        preemption="on",
        preemption_grace_s=grace_s,
        preemption_min_admitted_s=2.0,
    )


def report(out: Outcome, grace_s: float, rep: Report, needs: str = "all 16 NPUs") -> None:
    rep.add("high-priority submit -> RUNNING, cluster full of low runs", f"{out.to_start_s:.1f} s")
    lows = f"{len(out.victims)} of {len(out.lows)} low runs"
    rep.add("victims", f"{lows} (the high run needs {needs})")
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


def verl(port: int, grace_s: float) -> None:
    """The verl mode: the victim verl's own trainer, under the host's verl lock."""
    rep = Report("preemption of a verl run (cpu-smoke)")
    with LOCK.open("w") as lock:
        print(f"waiting for the verl lock {LOCK} ...", flush=True)
        fcntl.flock(lock, fcntl.LOCK_EX)
        ports = (port - RAY_PORT, port + 2000 - RAY_PORT)  # own_service's offsets
        with verl_preempted(ports, VERL_SYNCS, grace_s) as (out, _, _):
            report(out, grace_s, rep, needs="both NPU slots of the head")
    rep.print()


def tiny_grpo(port: int, grace_s: float, quick: bool) -> None:
    """The tiny-grpo mode: two low runs on a local head of two 8-NPU nodes."""
    low_versions, high_versions = (12, 1) if quick else (80, 6)
    rep = Report("preemption")
    with ray_head([8, 8], 8, port) as address:
        db_url = f"sqlite:///{tempfile.mkdtemp()}/bench.db"
        with TestClient(create_app(settings_for(address, db_url, grace_s))) as client:
            out = scenario(client, low_versions, high_versions)
    report(out, grace_s, rep)
    rep.print()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=4600)
    parser.add_argument("--grace", type=float, help=f"60 s; {VERL_GRACE_S:g} s with --verl")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true")
    mode.add_argument("--verl", action="store_true")
    args = parser.parse_args()
    if args.verl:
        verl(args.port, args.grace or VERL_GRACE_S)
    else:
        tiny_grpo(args.port, args.grace or 60.0, args.quick)


if __name__ == "__main__":
    main()

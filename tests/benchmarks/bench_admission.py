"""Admission speed with 10,000 queued runs on 1,000 nodes and with 1,000 on 100, and run end ->
next run submitted.

    python -m tests.benchmarks.bench_admission [--scale-rounds 10] [--rounds 20] [--chain 6]
        [--port 52679] [--quick]

``--quick``: one round at a tenth of the scale, 3 rounds, a chain of 2 at the 0.3 s loops only
(what CI runs).

0. ``decide`` at scale: 10,000 queued runs (mixed shapes, 20 teams, every other one with a
   quota, three priorities) on 1,000 nodes of 8 and 16 NPUs, the cluster mostly busy; one round
   with every run's queue reason, against the straightforward round on the same input. Then the
   submitter's decision at that scale with fair share's history weights and preemption
   (``decide_across`` with every team's recent usage, then ``preemption.choose``).
1. ``decide`` alone on a simulated inventory (100 nodes x 8 NPUs, 1,000 queued runs of mixed
   shapes, teams and priorities, the cluster mostly busy): rounds per second, and queued runs
   decided per second.
2. The submitter's whole round on SQLite (read the queue, decide, claim, store the reasons),
   with the same simulated inventory.
3. On a real local Ray cluster (two nodes x 8 NPUs): a chain of runs that each need the whole
   cluster; for each handover, the time from Ray's end of one run to the service's submission
   of the next (the service's loops at their default periods, then at 0.3 s).
"""

from __future__ import annotations

import argparse
import collections
import itertools
import random
import statistics
import tempfile
import time
from datetime import datetime
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import insert

from service.app import create_app
from service.cluster.ray_jobs import RayJobs
from service.loops.submitter import Submitter
from service.scheduling import preemption
from service.scheduling.across import ClusterState, decide_across
from service.scheduling.admission import HeldRun, QueuedRun, Quotas, decide
from service.scheduling.inventory import Inventory, Node
from service.scheduling.preemption import Policy, Running
from service.scheduling.shape import Group, ResourceShape
from service.settings import Settings
from service.store.db import Database, upgrade
from service.store.models import Run, utcnow
from tests.benchmarks.report import Report, ray_head
from tests.conftest import RAY_TOKENS

SHAPES = [
    ResourceShape(
        "NPU", (Group("trainer", 8, 24.0),) * n + (Group("rollout", tp, 2.0 * tp),) * r, 23
    )
    for n, tp, r in [(1, 2, 2), (2, 4, 2), (4, 8, 2), (1, 1, 1), (2, 2, 4), (8, 8, 4)]
] + [ResourceShape("NPU", (Group("job", 4, 4.0),), 1.0), ResourceShape("NPU", (), 1.0)]


def simulated(
    n_nodes: int = 100, n_queued: int = 1000
) -> tuple[Inventory, list[QueuedRun], list[HeldRun]]:
    rng = random.Random(7)
    nodes = []
    for i in range(n_nodes):
        busy = rng.choice([0, 0, 4, 8, 8, 8])
        total = {"NPU": 8.0, "CPU": 192.0, "memory": 1.5e12}
        nodes.append(Node(f"node{i:03d}", total, {"NPU": 8.0 - busy, "CPU": 192.0 - 3 * busy}))
    held = [HeldRun(f"h{i}", f"team{i % 10}", SHAPES[i % 2], settled=True) for i in range(25)]
    queued = [
        QueuedRun(
            f"q{i:05d}", f"team{rng.randrange(10)}", rng.choice([0, 1, 1, 1, 2]), rng.choice(SHAPES)
        )
        for i in range(n_queued)
    ]
    return Inventory(tuple(nodes)), queued, held


def bench_decide(report: Report, rounds: int) -> None:
    inventory, queued, held = simulated()
    quotas = Quotas({"team0": 64, "team1": 128}, default=None)
    decide(queued, held, inventory, quotas)
    start = time.perf_counter()
    for _ in range(rounds):
        decision = decide(queued, held, inventory, quotas, limit=16)
    elapsed = time.perf_counter() - start
    report.add(
        "decide, 1000 queued on 100 nodes",
        f"{rounds / elapsed:.1f} rounds/s, "
        f"{rounds * len(queued) / elapsed:,.0f} queued runs decided/s "
        f"({elapsed / rounds * 1000:.1f} ms per round; {len(decision.admit)} admitted)",
    )


def at_scale(
    n_nodes: int = 1000, n_queued: int = 10_000, n_teams: int = 20
) -> tuple[Inventory, list[QueuedRun], list[HeldRun], Quotas]:
    """Mixed nodes (8 and 16 NPUs), the cluster mostly busy, every other team with a quota;
    each queued run's shape read as from the database."""
    rng = random.Random(11)
    nodes = []
    for i in range(n_nodes):
        size = rng.choice([8.0, 8.0, 16.0])
        busy = rng.choice([size, size, size, size - 2, size / 2, 0.0])
        total = {"NPU": size, "CPU": 24 * size, "memory": 1.5e12}
        nodes.append(Node(f"node{i:04d}", total, {"NPU": size - busy, "CPU": 24 * (size - busy)}))
    teams = [f"team{t:02d}" for t in range(n_teams)]
    held = [HeldRun(f"h{i}", teams[i % n_teams], SHAPES[i % 2], settled=True) for i in range(400)]
    queued = []
    for i in range(n_queued):
        shape = ResourceShape.from_dict(rng.choice(SHAPES).as_dict())
        queued.append(QueuedRun(f"q{i:05d}", rng.choice(teams), rng.choice([0, 1, 1, 1, 2]), shape))
    quotas = Quotas({t: rng.choice([64, 256, 1024, 4096]) for t in teams[::2]})
    return Inventory(tuple(nodes)), queued, held, quotas


def bench_decide_at_scale(rounds: int, n_nodes: int = 1000, n_queued: int = 10_000) -> None:
    """One round with 10,000 queued on 1,000 nodes, every run's queue reason included; the
    straightforward round (tests/admission_reference.py) beside it, same input."""
    from tests import admission_reference

    inventory, queued, held, quotas = at_scale(n_nodes, n_queued)
    figures = {}
    for name, round_of in (("fast", decide), ("straightforward", admission_reference.decide)):
        wall, cpu = [], []
        for _ in range(rounds):
            start, cpu_start = time.perf_counter(), time.process_time()
            decision = round_of(queued, held, inventory, quotas, 16)
            wall.append((time.perf_counter() - start) * 1000)
            cpu.append((time.process_time() - cpu_start) * 1000)
        figures[name] = (statistics.median(wall), statistics.median(cpu), decision)
    fast, plain = figures["fast"], figures["straightforward"]
    assert fast[2] == plain[2]
    kinds = collections.Counter(r.split(":")[0].split(" run")[0] for r in fast[2].reasons.values())
    print(
        f"admission round, {n_queued:,} queued x {n_nodes:,} nodes, 20 teams, median of {rounds}: "
        f"{fast[0]:.0f} ms ({fast[1]:.0f} ms CPU) vs straightforward {plain[0]:.0f} ms "
        f"({plain[1]:.0f} ms CPU), same decision; {len(fast[2].admit)} admitted, reasons for "
        f"{len(fast[2].reasons)}: {dict(kinds)}"
    )


def bench_history_and_preemption(rounds: int, n_nodes: int = 1000, n_queued: int = 10_000) -> float:
    """The submitter's decision at the same scale with fair share's memory (every team with
    recent usage) and preemption on, on a full cluster: every node held whole by a running run
    of priority low or normal (admitted long ago, some without checkpoints, some preempted
    before), so every queued run waits for capacity and the high ones look for victims.
    ``decide_across`` with the history weights, then ``preemption.choose`` over the runs left
    waiting for capacity. Returns the median milliseconds."""
    full, queued, _, quotas = at_scale(n_nodes, n_queued)
    nodes = tuple(Node(n.id, n.total, {"NPU": 0.0, "CPU": n.total["CPU"] / 2}) for n in full.nodes)
    inventory = Inventory(nodes)
    rng = random.Random(5)
    recent = {f"team{t:02d}": rng.uniform(0.0, 200.0) for t in range(20)}
    now = time.time()
    running, held = [], []
    for i, node in enumerate(nodes):
        size = int(node.total["NPU"])
        shape = ResourceShape("NPU", (Group("job", size, 2.0 * size),), 1.0)
        team = f"team{i % 20:02d}"
        held.append(HeldRun(f"h{i:04d}", team, shape, settled=True))
        running.append(
            Running(
                f"h{i:04d}",
                team,
                rng.choice([0, 1]),
                shape,
                admitted_at=now - rng.uniform(900, 86400),
                started_at=now - rng.uniform(0, 800),
                saves=rng.random() < 0.8,
                unsaved_s=rng.choice([0.0, 30.0, 120.0, 600.0]),
                times=rng.choice([0, 0, 1, 3]),
                last_preempted_at=now - rng.uniform(0, 7200),
            )
        )
    state = ClusterState("default", inventory, held)
    candidates = {r.id: ["default"] for r in queued}
    policy = Policy()
    by_id = {r.id: r for r in queued}
    wall, cpu, choosing, victims, preemptors = [], [], [], 0, 0
    for _ in range(rounds):
        start, cpu_start = time.perf_counter(), time.process_time()
        decision = decide_across([state], queued, candidates, quotas, 16, recent)
        waiting = preemption.waiting(decision.order, by_id, decision.reasons)
        chose = time.process_time()
        choice = preemption.choose(waiting, running, inventory, quotas, policy, now)
        choosing.append((time.process_time() - chose) * 1000)
        wall.append((time.perf_counter() - start) * 1000)
        cpu.append((time.process_time() - cpu_start) * 1000)
        preemptors = len(choice.preemptions)
        victims = sum(len(p.victims) for p in choice.preemptions)
    median = statistics.median(wall)
    print(
        f"admission round with history weights and preemption, {n_queued:,} queued x "
        f"{n_nodes:,} nodes held whole by {len(running):,} running runs, median of {rounds}: "
        f"{median:.0f} ms ({statistics.median(cpu):.0f} ms CPU, of which preemption "
        f"{statistics.median(choosing):.0f} ms); {len(waiting):,} wait for "
        f"capacity, {preemptors} runs preempt {victims} victims"
    )
    return median


class FixedInventory:
    def __init__(self, inventory: Inventory) -> None:
        self.inventory = inventory

    def get(self, max_age_s: float | None = None) -> Inventory:
        return Inventory(self.inventory.nodes)


def bench_submitter_round(report: Report, rounds: int) -> None:
    inventory, queued, _ = simulated()
    url = f"sqlite:///{tempfile.mkdtemp()}/bench.db"
    upgrade(url)
    db = Database(url)
    now = utcnow()
    rows = [
        {
            "id": q.id,
            "name": q.id,
            "recipe": "bench",
            "team": q.team,
            "priority": q.priority,
            "status": "QUEUED",
            "health": "ok",
            "spec": {},
            "created_at": now,
            "updated_at": now,
            "launch": {"shape": q.shape.as_dict()},
        }
        for q in queued
    ]
    with db.transaction() as session:
        session.execute(insert(Run), rows)
    submitter = Submitter(db, None, FixedInventory(inventory), Quotas(), "bench", 60, 16)  # type: ignore[arg-type]
    times = []
    inventories = {submitter.clusters.primary.name: inventory}
    for _ in range(rounds):
        start = time.perf_counter()
        with db.transaction() as session:
            submitter._claim(session, inventories)
        times.append(time.perf_counter() - start)
    report.add(
        "submitter round on SQLite (1000 queued, 16 claimed per round, reasons stored)",
        f"first {times[0] * 1000:.0f} ms, "
        f"then median {statistics.median(times[1:]) * 1000:.0f} ms "
        f"({1 / statistics.median(times[1:]):.1f} rounds/s)",
    )
    db.dispose()


def bench_handover(report: Report, chain: int, port: int, fast: bool) -> list[float]:
    with ray_head([8, 8], 8, port) as address:
        return _handover(report, address, chain, fast)


def _handover(report: Report, address: str, chain: int, fast: bool) -> list[float]:
    overrides: dict[str, Any] = (
        {"submit_interval_s": 0.3, "reconcile_interval_s": 0.3} if fast else {}
    )
    settings = Settings(
        database_url=f"sqlite:///{tempfile.mkdtemp()}/bench.db",
        ray_address=address,
        ray_token=RAY_TOKENS.get(address),
        recipe_plugins="tests.recipes:register",
        **overrides,
    )
    ray = RayJobs(address, RAY_TOKENS.get(address))
    gaps: list[float] = []
    noticed: list[float] = []
    try:
        with TestClient(create_app(settings), base_url="http://127.0.0.1") as client:
            spec = {
                "recipe": "test-script",
                "seconds": 1,
                "groups": [{"accelerators": 8, "count": 2}],
            }
            ids = [client.post("/runs", json=spec).json()["id"] for _ in range(chain)]
            deadline = time.monotonic() + 60 * chain
            while time.monotonic() < deadline:
                runs = [client.get(f"/runs/{i}").json() for i in ids]
                if all(r["status"] in {"SUCCEEDED", "FAILED", "STOPPED", "LOST"} for r in runs):
                    break
                time.sleep(0.5)
            for prev, nxt in itertools.pairwise(ids):
                ended = ray.get(prev)
                seen = client.get(f"/runs/{prev}").json()["ended_at"]
                submitted = client.get(f"/runs/{nxt}").json()["submitted_at"]
                assert ended is not None and ended.end_time_ms and submitted and seen
                at, seen_at = (datetime.fromisoformat(t).timestamp() for t in (submitted, seen))
                gaps.append(at - ended.end_time_ms / 1000)
                noticed.append(seen_at - ended.end_time_ms / 1000)
    finally:
        ray.close()
    label = "0.3 s loops" if fast else "default loops (submit 1 s, reconcile 2 s)"
    report.add(
        f"run end (Ray) -> next run submitted, {label}",
        f"median {statistics.median(gaps):.2f} s, "
        f"min {min(gaps):.2f} s, max {max(gaps):.2f} s over {len(gaps)} handovers; of which "
        f"Ray end -> service records the end: median {statistics.median(noticed):.2f} s, "
        f"max {max(noticed):.2f} s",
    )
    return gaps


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--fast-only", action="store_true", help="only the 0.3 s loop figures")
    parser.add_argument("--chain", type=int, default=6)
    parser.add_argument("--port", type=int, default=52679)
    parser.add_argument("--scale-rounds", type=int, default=10, help="of 10,000 x 1,000")
    parser.add_argument("--quick", action="store_true", help="small, in seconds (what CI runs)")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.chain, args.fast_only, args.scale_rounds = 3, 2, True, 1
    # Quick: the same round at a tenth of the size (the straightforward one is slow at scale).
    bench_decide_at_scale(args.scale_rounds, *((100, 1000) if args.quick else ()))
    bench_history_and_preemption(args.scale_rounds, *((100, 1000) if args.quick else ()))
    report = Report("admission")
    bench_decide(report, args.rounds)
    bench_submitter_round(report, args.rounds)
    if not args.fast_only:
        bench_handover(report, args.chain, args.port, fast=False)
    bench_handover(report, args.chain, args.port, fast=True)
    report.print()


if __name__ == "__main__":
    main()

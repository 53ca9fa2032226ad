"""Admission speed across clusters: one round over 10 clusters x 100 nodes with 1,000 queued.

    python -m tests.benchmarks.bench_admission_clusters [--rounds 20] [--quick]

``--quick``: 3 rounds (what CI runs); the sizes stay the same.

The mix: six Atlas A2-like clusters (8 NPUs a node), three A3-like (16 NPUs a node), one GPU
cluster (8 GPUs a node); one A2 cluster is down (its last nodes known). Every cluster is mostly
busy with runs the service holds. The queue: 8 + 8 NPU runs, 1 + 1, 16 + 16 (which fit A3 nodes
only), 4-NPU jobs and a few GPU runs, from 20 teams in three priorities; every other team has a
global quota, two clusters have per-cluster quotas, two teams may use the A2 clusters only,
one run in ten is pinned to one cluster and one in five asks for A3 by selector. A round is
``decide_across`` with every run's reasons per cluster, capped at 16 admissions as the
submitter caps it, then with no cap; the figure is the median over the rounds, wall and CPU
time (on a loaded machine the wall time includes waiting for a core: the CPU time is the
round's own cost).
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import statistics
import time

from service.scheduling.across import ClusterDecision, ClusterState, decide_across
from service.scheduling.admission import HeldRun, QueuedRun, Quotas
from service.scheduling.inventory import Inventory, Node
from service.scheduling.shape import Group, ResourceShape
from tests.benchmarks.report import Report

GOAL_MS = 100.0


def npu(*groups: int, cpus_per: float = 2.0, driver: float = 4.0) -> ResourceShape:
    roles = ["trainer", "rollout"]
    return ResourceShape(
        "NPU", tuple(Group(roles[i % 2], g, cpus_per * g) for i, g in enumerate(groups)), driver
    )


EIGHT = npu(8, 8)
ONE = npu(1, 1)
SIXTEEN = npu(16, 16)
FOUR = ResourceShape("NPU", (Group("job", 4, 4.0),), 1.0)
GPU = ResourceShape("GPU", (Group("trainer", 8, 16.0), Group("rollout", 8, 16.0)), 4.0)
# Queue weights: mostly 8 + 8, many 1 + 1, some 16 + 16 and small jobs, a few GPU runs.
MIX = [EIGHT] * 5 + [ONE] * 3 + [SIXTEEN] * 2 + [FOUR] * 2 + [GPU]


def clusters(rng: random.Random, n_nodes: int = 100) -> list[ClusterState]:
    kinds = [("a2", 8, "NPU")] * 6 + [("a3", 16, "NPU")] * 3 + [("gpu", 8, "GPU")]
    out = []
    for c, (gen, size, acc) in enumerate(kinds):
        name = f"{gen}-{c}"
        nodes, held = [], []
        for i in range(n_nodes):
            # Busy, as with a long queue: whole nodes held by runs of the service, a few free.
            busy = rng.choice([size] * 16 + [size - 2, size / 2, 0, 0])
            total = {acc: float(size), "CPU": 24.0 * size, "memory": 1.5e12}
            free = {acc: float(size - busy), "CPU": 24.0 * (size - busy)}
            nodes.append(Node(f"{name}-n{i:03d}", total, free))
            if busy:
                shape = ResourceShape(acc, (Group("trainer", int(busy), 2.0 * busy),), 1.0)
                held.append(HeldRun(f"{name}-h{i}", f"team{i % 20:02d}", shape, settled=True))
        quotas = Quotas({"team01": 64, "team03": 128}) if c in (1, 7) else Quotas()
        down = "cluster down since 12:01:03" if c == 5 else None
        out.append(ClusterState(name, Inventory(tuple(nodes)), held, quotas=quotas, down=down))
    return out


def queue(
    rng: random.Random, states: list[ClusterState], n_queued: int = 1000
) -> tuple[list[QueuedRun], dict[str, list[str]]]:
    names = [c.name for c in states]
    a2 = [n for n in names if n.startswith("a2")]
    a3 = [n for n in names if n.startswith("a3")]
    gpu = [n for n in names if n.startswith("gpu")]
    queued, candidates = [], {}
    for i in range(n_queued):
        team = f"team{rng.randrange(20):02d}"
        base = rng.choice(MIX)
        # Each its own object, as when read from the database.
        shape = ResourceShape(base.accelerator, tuple(base.groups), base.driver_cpus)
        run = QueuedRun(f"q{i:04d}", team, rng.choice([0, 1, 1, 1, 2]), shape)
        allowed = a2 if team in ("team18", "team19") else names
        if shape.accelerator == "GPU":
            where = gpu
        elif rng.random() < 0.1:
            where = [rng.choice(allowed)]  # pinned to one cluster
        elif rng.random() < 0.2:
            where = [n for n in allowed if n in a3] or allowed  # a selector: generation a3
        else:
            where = [n for n in allowed if n not in gpu]
        queued.append(run)
        candidates[run.id] = where
    return queued, candidates


def global_quotas(rng: random.Random) -> Quotas:
    return Quotas({f"team{t:02d}": rng.choice([64, 256, 1024]) for t in range(0, 20, 2)})


def bench(report: Report, rounds: int) -> None:
    rng = random.Random(22)
    states = clusters(rng)
    queued, candidates = queue(rng, states)
    quotas = global_quotas(rng)
    for limit in (16, None):
        decision: ClusterDecision | None = None
        wall, cpu = [], []
        for _ in range(rounds):
            start, cpu_start = time.perf_counter(), time.process_time()
            decision = decide_across(states, queued, candidates, quotas, limit=limit)
            wall.append((time.perf_counter() - start) * 1000)
            cpu.append((time.process_time() - cpu_start) * 1000)
        assert decision is not None
        where = collections.Counter(cluster for _, cluster in decision.admit)
        kinds = collections.Counter(_kind(r) for r in decision.reasons.values())
        load = os.getloadavg()[0]
        median_wall, median_cpu = statistics.median(wall), statistics.median(cpu)
        capped = "16 admissions at most" if limit else "no cap"
        report.add(
            f"round over 10 clusters x 100 nodes, 1,000 queued, {capped}, median of {rounds}",
            f"{median_wall:.1f} ms wall, {median_cpu:.1f} ms CPU, fastest {min(wall):.1f} ms "
            f"wall (goal <= {GOAL_MS:.0f} ms: {_met(median_wall)} in wall time, "
            f"{_met(median_cpu)} in CPU time; load average {load:.1f} on {os.cpu_count()} cores)",
        )
        reasons = sum(len(r) for r in decision.by_cluster.values())
        report.add(
            f"its decision ({capped})",
            f"{len(decision.admit)} admitted on {len(where)} clusters, "
            f"{len(decision.reasons)} waiting: {dict(kinds)}; {reasons} reasons per cluster",
        )


def _met(ms: float) -> str:
    return "met" if ms <= GOAL_MS else "NOT met"


KINDS = ("capacity", "behind", "quota", "next in line", "cluster down", "no cluster")


def _kind(reason: str) -> str:
    """A queue reason's kind: what it waits for, without the cluster names and figures."""
    head = reason.split(": ", 1)[1] if reason.startswith("waits for ") else reason
    return next((k for k in KINDS if head.startswith(k)), head)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="3 rounds (what CI runs)")
    args = parser.parse_args()
    if args.quick:
        args.rounds = 3
    report = Report("admission across clusters")
    bench(report, args.rounds)
    report.print()


if __name__ == "__main__":
    main()

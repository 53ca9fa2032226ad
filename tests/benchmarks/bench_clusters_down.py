"""A cluster that goes away and comes back: the timeline, in wall-clock seconds.

    PYTHONPATH=$PWD python -m tests.benchmarks.bench_clusters_down [--down-after 6] [--probe 1]
    PYTHONPATH=$PWD python -m tests.benchmarks.bench_clusters_down --quick

The service's loops (submitter, reconciler, follower, cluster health) run as the service runs
them, at their intervals, on SQLite, over two in-memory Rays (tests/fake_ray.py): `a` with one
node of 8 NPUs, `b` with two. On `b` run one job without a retry policy and one whose policy
names `cluster_down`; a run that fits only `b` waits. Then every call to `b` fails (its head
"stops"), and later answers again. Prints when `b` is marked down, the run LOST, the other
requeued and running on `a`, the waiting run's reason, `b` marked up and the waiting run placed
there. The defaults are the service's (probe every 1 s, down after 6 s); the real heads' version
of this is tests/test_clusters_ray.py.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from typing import Any

from service.cluster.inventory_cache import InventoryCache
from service.cluster.ray_jobs import RayUnavailable
from service.cluster.registry import ClusterHandle, Clusters
from service.cluster.spec import ClusterSpec
from service.loops.base import Loop
from service.loops.cluster_health import ClusterHealth
from service.loops.follower import Follower
from service.loops.reconciler import Reconciler
from service.loops.submitter import Submitter
from service.metrics.health import HealthRules
from service.recipes.base import Launch
from service.recovery.retry import RetryConfig
from service.scheduling.admission import Quotas
from service.scheduling.shape import Group, ResourceShape
from service.store.db import Database, upgrade
from service.store.models import Run
from tests.benchmarks.report import table
from tests.factories import add_run
from tests.fake_ray import FakeRay


class Head(FakeRay):
    """An in-memory Ray whose head can stop answering (every call fails, as a refused
    connection does) and answer again; it runs each job it is given."""

    def __init__(self, nodes: dict[str, dict[str, float]]) -> None:
        super().__init__(nodes)
        self.down = False

    def _answer(self, method: str, value: Any) -> Any:
        if self.down:
            raise RayUnavailable(f"{method}: connection refused")
        return super()._answer(method, value)

    def submit(
        self, submission_id: str, entrypoint: str, runtime_env: dict[str, Any], *a: Any, **k: Any
    ) -> bool:
        fresh = super().submit(submission_id, entrypoint, runtime_env, *a, **k)
        self.set_status(submission_id, "RUNNING")
        return fresh


def _launch(*sizes: int) -> dict[str, Any]:
    groups = tuple(Group(f"g{i}", n, 0.0) for i, n in enumerate(sizes))
    return Launch(["true"], {}, ResourceShape(groups=groups, driver_cpus=0.1)).as_dict() | {
        "where": {}
    }


def _status(db: Database, run_id: str) -> tuple[str, int, str | None, str | None]:
    with db.read() as s:
        run = s.get(Run, run_id)
        assert run is not None
        return run.status, run.attempt, run.cluster, run.queue_reason


async def timeline(down_after_s: float, probe_s: float, workdir: str) -> list[tuple[str, float]]:
    url = f"sqlite:///{workdir}/bench.db"
    upgrade(url)
    db = Database(url)
    a = Head({"a1": {"NPU": 8.0, "CPU": 16.0}})
    b = Head({"b1": {"NPU": 8.0, "CPU": 16.0}, "b2": {"NPU": 8.0, "CPU": 16.0}})
    clusters = Clusters(
        [
            ClusterHandle(ClusterSpec(name=n, address=f"http://{n}"), h, InventoryCache(h, 0.0))
            for n, h in (("a", a), ("b", b))
        ]
    )
    retry = RetryConfig()
    add_run(db, "fill", "QUEUED", launch=_launch(7))  # a is full but for 1 NPU
    add_run(db, "big", "QUEUED", launch=_launch(8, 4))  # only b holds 8 + 4
    policy = {"retry": {"max_attempts": 2, "on": ["cluster_down"], "backoff_s": 0}}
    add_run(db, "moving", "QUEUED", spec=policy, launch=_launch(1, 1))  # no room on a
    loops = [
        Loop("submitter", Submitter(db, clusters, None, Quotas(), "me", 30.0, 10).tick, 0.3, 2),
        Loop("reconciler", Reconciler(db, clusters).tick, 0.3, 2),
        Loop("follower", Follower(db, clusters, "me", 30.0, 10_000, HealthRules()).tick, 0.3, 2),
        Loop("health", ClusterHealth(db, clusters, down_after_s, retry=retry).tick, probe_s, 2),
    ]
    stop = asyncio.Event()
    tasks = [asyncio.create_task(loop.run(stop)) for loop in loops]
    marks: list[tuple[str, float]] = []

    async def until(what: str, check: Any, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                raise TimeoutError(what)
            await asyncio.sleep(0.1)
        marks.append((what, time.monotonic()))

    try:
        await until("runs RUNNING", lambda: _status(db, "moving")[0] == "RUNNING")
        assert _status(db, "big")[2] == "b" and _status(db, "moving")[2] == "b"
        add_run(db, "waiting", "QUEUED", launch=_launch(8, 8))  # fits only b, busy
        a.set_status("fill", "SUCCEEDED")  # room on a for the run that moves
        await until("a has room", lambda: _status(db, "fill")[0] == "SUCCEEDED")
        b.down = True
        marks.append(("head b stopped", time.monotonic()))
        health = clusters.of("b").health
        await until("b marked down", lambda: not health.up)
        await until("running run LOST", lambda: _status(db, "big")[0] == "LOST")
        await until("retried run requeued", lambda: _status(db, "moving")[1] == 2)
        await until(
            "retried run running on a",
            lambda: _status(db, "moving")[0] == "RUNNING" and _status(db, "moving")[2] == "a",
        )
        await until(
            "waiting run says cluster down",
            lambda: "cluster down" in (_status(db, "waiting")[3] or ""),
        )
        await asyncio.sleep(1.0)
        b.down = False
        b.jobs.clear()  # a restarted head has lost its jobs
        marks.append(("head b answers", time.monotonic()))
        await until("b marked up", lambda: health.up)
        await until("waiting run placed on b", lambda: _status(db, "waiting")[2] == "b")
        assert [j["submission_id"] for j in b.submitted] == ["big", "moving", "waiting"]
        assert [j["submission_id"] for j in a.submitted] == ["fill", "moving-a2"]
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        db.dispose()
    return marks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--down-after", type=float, default=6.0, help="RLRUN_CLUSTER_DOWN_AFTER_S")
    parser.add_argument("--probe", type=float, default=1.0, help="RLRUN_CLUSTER_PROBE_INTERVAL_S")
    parser.add_argument("--quick", action="store_true", help="down after 2 s, probe every 0.5 s")
    args = parser.parse_args()
    down_after, probe = (2.0, 0.5) if args.quick else (args.down_after, args.probe)
    with tempfile.TemporaryDirectory() as tmp:
        marks = asyncio.run(timeline(down_after, probe, tmp))
    start = dict(marks)["head b stopped"]
    print(f"cluster b down and back (probe every {probe:g} s, down after {down_after:g} s)\n")
    print(table(["event", "s after head b stopped"], [(w, f"{t - start:.1f}") for w, t in marks]))


if __name__ == "__main__":
    main()

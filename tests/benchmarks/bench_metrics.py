"""Metrics benchmarks; prints figures. Run from the repo root:

    PYTHONPATH=$PWD python tests/benchmarks/bench_metrics.py [ingest] [query] [latency] [cpu] [tiny]

- ingest: metric points stored per second (follower-sized batches) on SQLite and PostgreSQL.
- query: ``GET /runs/{id}/metrics`` for one key with 100,000 steps downsampled to 1,000 points.
- latency: p50/p95 from a metric line printed in a real Ray job (by an actor, so Ray's log
  forwarding is included) to an SSE client, on a local Ray head.
- cpu: service CPU with 50 active runs streaming, each followed over a synthetic growing log
  (simulated: 50 real Ray jobs do not fit 2 cores), with one SSE client per run (the live part
  of ``bench_metrics_peers``).
- tiny: the default tiny-grpo run: time until its mean reward is above 0.8.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar, Literal

import httpx
from fastapi.testclient import TestClient

from service.app import create_app
from service.metrics import store
from service.metrics.parse import MetricLine
from service.recipes.base import Launch, LaunchContext, ResourceShape, RunSpec
from service.recipes.registry import default_registry
from service.settings import Settings
from service.store.db import Database, upgrade
from tests import postgres
from tests.factories import add_run

RAY_PORT = int(os.environ.get("RLRUN_TEST_RAY_PORT", "46379")) + 200
KEYS = 50


@contextmanager
def databases(tmp: Path) -> Iterator[list[tuple[str, str]]]:
    sqlite = f"sqlite:///{tmp}/bench.db"
    upgrade(sqlite)
    with postgres.admin_url() as admin, postgres.fresh_database(admin, "rlrun_bench") as pg:
        yield [("sqlite", sqlite), ("postgres", pg)]


def bench_ingest(urls: list[tuple[str, str]]) -> None:
    lines_per_commit, commits = 10, 200  # a follower read of 10 lines, 50 keys each
    for label, url in urls:
        db = Database(url)
        run_id = f"ingest-{uuid.uuid4().hex[:6]}"
        add_run(db, run_id)
        step = 0
        started = time.perf_counter()
        for _ in range(commits):
            batch = []
            for _line in range(lines_per_commit):
                step += 1
                batch.append(
                    (step * 100, MetricLine(step, {f"k/{k}": step * 0.1 + k for k in range(KEYS)}))
                )
            with db.transaction() as s:
                store.add_lines(s, run_id, batch)
        elapsed = time.perf_counter() - started
        total = step * KEYS
        print(
            f"ingest {label:8s}: {total} points in {elapsed:.2f} s = "
            f"{total / elapsed:,.0f} points/s ({lines_per_commit} lines x {KEYS} keys per commit)"
        )
        db.dispose()


def bench_query(urls: list[tuple[str, str]], steps: int = 100_000, max_points: int = 1000) -> None:
    for label, url in urls:
        db = Database(url)
        run_id = f"query-{uuid.uuid4().hex[:6]}"
        add_run(db, run_id)
        for lo in range(0, steps, 10_000):
            with db.transaction() as s:
                store.add_lines(
                    s,
                    run_id,
                    [
                        (i + 1, MetricLine(i, {"critic/score/mean": (i % 977) / 977}))
                        for i in range(lo, min(steps, lo + 10_000))
                    ],
                )
        db.dispose()
        # Aligned buckets of a power-of-two width: at most max_points of them, usually fewer.
        w = store.width(0, steps - 1, max_points)
        buckets = (steps - 1) // w + 1
        settings = Settings(database_url=url, ray_address="http://127.0.0.1:9", run_loops=False)
        with TestClient(create_app(settings)) as client:
            params: dict[str, str | int] = {"keys": "critic/score/mean", "max_points": max_points}
            answer = client.get(f"/runs/{run_id}/metrics", params=params).json()
            got = len(answer["series"]["critic/score/mean"])
            assert got == buckets <= max_points, (got, buckets)
            times = []
            for _ in range(20):
                t0 = time.perf_counter()
                client.get(f"/runs/{run_id}/metrics", params=params).raise_for_status()
                times.append(time.perf_counter() - t0)
        times.sort()
        print(
            f"/metrics {label:8s}: 1 key, {steps:,} steps -> {got:,} points "
            f"(buckets of {w} steps, max_points {max_points:,}): "
            f"p50 {statistics.median(times) * 1000:.0f} ms, p95 {times[18] * 1000:.0f} ms"
        )


PRINTER = """
import sys, time, ray
ray.init()
@ray.remote(num_cpus=0.1)
class Printer:
    def run(self, lines, every):
        for step in range(1, lines + 1):
            now = time.time()
            print(f"step:{step} - bench/printed_at:{now!r} - critic/score/mean:0.5", flush=True)
            time.sleep(every)
p = Printer.remote()
ray.get(p.run.remote(int(sys.argv[1]), float(sys.argv[2])))
time.sleep(2)
"""


class PrinterSpec(RunSpec):
    recipe: Literal["bench-printer"] = "bench-printer"
    lines: int = 100
    every: float = 0.25


class PrinterRecipe:
    name: ClassVar[str] = "bench-printer"
    spec_model: ClassVar[type[RunSpec]] = PrinterSpec

    def build(self, spec: Any, ctx: LaunchContext) -> Launch:
        return Launch(
            argv=["python3", "-c", PRINTER, str(spec.lines), str(spec.every)],
            runtime_env={"env_vars": {"RAY_DEDUP_LOGS": "0"}},
            shape=ResourceShape(driver_cpus=0.1),
            entrypoint_num_cpus=0.1,
        )


def bench_latency(tmp: Path) -> None:
    from service.cluster.local_ray import LocalRayCluster
    from tests.live import ServerThread, SseClient

    cluster = LocalRayCluster(
        [4], cpus_per_node=4, port=RAY_PORT, dashboard_port=RAY_PORT + 2000
    ).start()
    try:
        registry = default_registry()
        registry.register(PrinterRecipe())
        for follow_s in (1.0, 0.3):
            settings = Settings(
                database_url=f"sqlite:///{tmp}/lat-{follow_s}.db",
                ray_address=cluster.address,
                follow_interval_s=follow_s,
                submit_interval_s=0.3,
                reconcile_interval_s=0.5,
            )
            with ServerThread(create_app(settings, registry)) as url:
                run_id = httpx.post(f"{url}/runs", json={"recipe": "bench-printer"}).json()["id"]
                client = SseClient(run_id, url)
                delays: list[float] = []
                orig = client._deliver

                def deliver(event: Any, orig: Any = orig, delays: list[float] = delays) -> None:
                    if event.kind == "metrics":
                        delays.append(time.time() - event.data["values"]["bench/printed_at"])
                    orig(event)

                client._deliver = deliver  # type: ignore[method-assign]
                client.start()
                assert client.ended.wait(180), "stream did not end"
            delays.sort()
            print(
                f"print -> SSE (follow interval {follow_s} s, {len(delays)} lines): "
                f"p50 {statistics.median(delays) * 1000:.0f} ms, "
                f"p95 {delays[int(len(delays) * 0.95)] * 1000:.0f} ms"
            )
    finally:
        cluster.cleanup()


def bench_tiny_grpo(tmp: Path) -> None:
    """Default tiny-grpo on a local head: seconds from POST to a mean reward above 0.8."""
    from service.cluster.local_ray import LocalRayCluster
    from tests.live import ServerThread, SseClient

    cluster = LocalRayCluster(
        [8, 8], cpus_per_node=8, port=RAY_PORT, dashboard_port=RAY_PORT + 2000
    ).start()
    try:
        settings = Settings(
            database_url=f"sqlite:///{tmp}/tiny.db",
            ray_address=cluster.address,
            submit_interval_s=0.3,
            reconcile_interval_s=0.5,
        )
        with ServerThread(create_app(settings)) as url:
            posted = time.monotonic()
            run_id = httpx.post(f"{url}/runs", json={"recipe": "tiny-grpo"}).json()["id"]
            client = SseClient(run_id, url).start()
            client.wait(lambda c: "RUNNING" in c.statuses(), 120)
            running = time.monotonic()
            client.wait(
                lambda c: any(v.get("critic/score/mean", 0) > 0.8 for _, v in c.metrics()), 120
            )
            above = time.monotonic()
            assert client.ended.wait(120)
            ended = time.monotonic()
        rewards = [v["critic/score/mean"] for _, v in client.metrics() if "critic/score/mean" in v]
        print(
            f"tiny-grpo (defaults, 2 cores): first reward {rewards[0]:.3f}, "
            f"last {rewards[-1]:.3f}; "
            f"reward > 0.8 seen by an SSE client {above - posted:.1f} s after POST "
            f"({above - running:.1f} s after RUNNING); whole run {ended - posted:.1f} s"
        )
    finally:
        cluster.cleanup()


def bench_cpu(tmp: Path, runs: int = 50, seconds: float = 30.0) -> None:
    from tests.benchmarks.bench_metrics_peers import bench_live

    url = f"sqlite:///{tmp}/cpu.db"
    upgrade(url)
    for row in bench_live("sqlite", url, tmp, runs, runs, seconds):
        print(f"{row.goal} (SQLite): {row.ours:,.0f} {row.unit}")


def main() -> None:
    parts = set(sys.argv[1:]) or {"ingest", "query", "latency", "cpu", "tiny"}
    tmp = Path(f"/tmp/rlrun-bench-{uuid.uuid4().hex[:6]}")
    tmp.mkdir()
    with databases(tmp) as urls:
        if "ingest" in parts:
            bench_ingest(urls)
        if "query" in parts:
            bench_query(urls)
    if "latency" in parts:
        bench_latency(tmp)
    if "cpu" in parts:
        bench_cpu(tmp)
    if "tiny" in parts:
        bench_tiny_grpo(tmp)


if __name__ == "__main__":
    main()

"""Metrics benchmarks; prints figures. Run from the repo root:

    PYTHONPATH=$PWD python tests/benchmarks/bench_metrics.py [ingest] [query] [latency] [cpu] [tiny]
        [--quick]

- ingest: metric points stored per second (follower-sized batches) on SQLite and PostgreSQL.
- query: ``GET /runs/{id}/metrics`` for one key with 100,000 steps downsampled to 1,000 points.
- latency: p50/p95 from a metric line printed in a real Ray job (by an actor, so Ray's log
  forwarding is included) to an SSE client, on a local Ray head.
- cpu: service CPU with 50 active runs streaming, each followed over a synthetic growing log
  (simulated: 50 real Ray jobs do not fit 2 cores), with one SSE client per run (the live part
  of ``bench_metrics_peers``).
- tiny: the default tiny-grpo run: time until its mean reward is above 0.8.

``--quick`` runs the parts named (all but tiny by default: a whole training run is not quick)
at small sizes, in seconds (what CI runs).
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
from service.recipes.base import Launch, LaunchContext, RunSpec
from service.recipes.registry import default_registry
from service.scheduling.shape import ResourceShape
from service.settings import Settings
from service.store.db import Database, upgrade
from tests import postgres
from tests.benchmarks.report import Report, ray_head
from tests.conftest import RAY_TOKENS
from tests.factories import add_run

RAY_PORT = int(os.environ.get("RLRUN_TEST_RAY_PORT", "20379")) + 200
KEYS = 50


@contextmanager
def databases(tmp: Path) -> Iterator[list[tuple[str, str]]]:
    sqlite = f"sqlite:///{tmp}/bench.db"
    upgrade(sqlite)
    with postgres.admin_url() as admin, postgres.fresh_database(admin, "rlrun_bench") as pg:
        yield [("sqlite", sqlite), ("postgres", pg)]


def bench_ingest(report: Report, urls: list[tuple[str, str]], commits: int = 200) -> None:
    lines_per_commit = 10  # a follower read of 10 lines, 50 keys each
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
        report.add(
            f"ingest {label}, {lines_per_commit} lines x {KEYS} keys per commit",
            f"{total / elapsed:,.0f} points/s ({total} points in {elapsed:.2f} s)",
        )
        db.dispose()


def bench_query(
    report: Report, urls: list[tuple[str, str]], steps: int = 100_000, max_points: int = 1000
) -> None:
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
        with TestClient(create_app(settings), base_url="http://127.0.0.1") as client:
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
        report.add(
            f"/metrics {label}: 1 key, {steps:,} steps -> {got:,} points "
            f"(buckets of {w} steps, max_points {max_points:,})",
            f"p50 {statistics.median(times) * 1000:.0f} ms, p95 {times[18] * 1000:.0f} ms",
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


def bench_latency(report: Report, tmp: Path, quick: bool = False) -> None:
    from tests.live import ServerThread, SseClient

    spec = {"recipe": "bench-printer"} | ({"lines": 10, "every": 0.1} if quick else {})
    with ray_head([4], 4, RAY_PORT) as address:
        registry = default_registry()
        registry.register(PrinterRecipe())
        for follow_s in (0.3,) if quick else (1.0, 0.3):
            settings = Settings(
                database_url=f"sqlite:///{tmp}/lat-{follow_s}.db",
                ray_address=address,
                ray_token=RAY_TOKENS.get(address),
                follow_interval_s=follow_s,
                submit_interval_s=0.3,
                reconcile_interval_s=0.5,
            )
            with ServerThread(create_app(settings, registry)) as url:
                run_id = httpx.post(f"{url}/runs", json=spec).json()["id"]
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
            report.add(
                f"print -> SSE (follow interval {follow_s} s, {len(delays)} lines)",
                f"p50 {statistics.median(delays) * 1000:.0f} ms, "
                f"p95 {delays[int(len(delays) * 0.95)] * 1000:.0f} ms",
            )


def bench_tiny_grpo(report: Report, tmp: Path) -> None:
    """Default tiny-grpo on a local head: seconds from POST to a mean reward above 0.8."""
    from tests.live import ServerThread, SseClient

    with ray_head([8, 8], 8, RAY_PORT) as address:
        settings = Settings(
            database_url=f"sqlite:///{tmp}/tiny.db",
            ray_address=address,
            ray_token=RAY_TOKENS.get(address),
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
        report.add(
            "tiny-grpo (defaults, 2 cores)",
            f"first reward {rewards[0]:.3f}, last {rewards[-1]:.3f}; "
            f"reward > 0.8 seen by an SSE client {above - posted:.1f} s after POST "
            f"({above - running:.1f} s after RUNNING); whole run {ended - posted:.1f} s",
        )


def bench_cpu(report: Report, tmp: Path, runs: int = 50, seconds: float = 30.0) -> None:
    from tests.benchmarks.bench_metrics_peers import bench_live

    url = f"sqlite:///{tmp}/cpu.db"
    upgrade(url)
    for row in bench_live("sqlite", url, tmp, runs, runs, seconds, warm_up=min(5.0, seconds)):
        report.add(f"{row.goal} (SQLite)", f"{row.ours:,.0f} {row.unit}")


def main() -> None:
    args = sys.argv[1:]
    quick = "--quick" in args
    every = {"ingest", "query", "latency", "cpu"} | (set() if quick else {"tiny"})
    parts = set(args) - {"--quick"} or every
    report = Report("metrics")
    tmp = Path(f"/tmp/rlrun-bench-{uuid.uuid4().hex[:6]}")
    tmp.mkdir()
    with databases(tmp) as urls:
        if "ingest" in parts:
            bench_ingest(report, urls, 20 if quick else 200)
        if "query" in parts:
            bench_query(report, urls, 10_000 if quick else 100_000)
    if "latency" in parts:
        bench_latency(report, tmp, quick)
    if "cpu" in parts:
        bench_cpu(report, tmp, *((2, 2.0) if quick else ()))
    if "tiny" in parts:
        bench_tiny_grpo(report, tmp)
    elif quick:
        report.skip("tiny-grpo", "a whole training run is not quick (run `tiny` alone)")
    report.print()


if __name__ == "__main__":
    main()

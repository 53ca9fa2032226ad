"""``GET /runs`` (the dashboard's runs view) with 10,000 runs that each logged metrics.

    python -m tests.benchmarks.bench_runs_list [--runs 10000] [--steps 20] [--pg URL] [--quick]

``--quick``: 200 runs of 5 steps (what CI runs).

Prints p50/p95 of a 50-run page (first page and a page deep in the history through the
cursor), and of the same page's summary metrics query alone (progress and latest reward for
50 runs in one query), on SQLite and PostgreSQL.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import create_engine, insert, text

from service.app import create_app
from service.metrics import store
from service.metrics.parse import MetricLine
from service.operations.run_docs import SUMMARY_KEYS
from service.settings import Settings
from service.store.db import Database, upgrade
from service.store.models import Run, utcnow
from tests.benchmarks.report import Report

LAUNCH = {"argv": [], "entrypoint": "", "runtime_env": {}, "shape": {}, "total_steps": 20}


def fill(db_url: str, runs: int, steps: int) -> list[str]:
    db = Database(db_url)
    ids = [f"r{i:012x}{uuid.uuid4().hex[:8]}" for i in range(runs)]
    now = utcnow()
    with db.transaction() as s:
        s.execute(
            insert(Run),
            [
                {"id": i, "name": f"run {n}", "recipe": "tiny-grpo", "team": f"t{n % 7}",
                 "status": "SUCCEEDED", "spec": {}, "launch": LAUNCH, "created_at": now}
                for n, i in enumerate(ids)
            ],
        )  # fmt: skip
    for chunk in range(0, runs, 500):
        with db.transaction() as s:  # through the store, so latest values and tiers are kept
            for i in ids[chunk : chunk + 500]:
                lines = [
                    (st, MetricLine(st, dict.fromkeys(SUMMARY_KEYS, st / steps)))
                    for st in range(1, steps + 1)
                ]
                store.add_lines(s, i, lines)
    db.dispose()
    return ids


def timed(fn: Callable[[], Any], n: int = 40) -> tuple[float, float]:
    fn()
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1000)
    samples.sort()
    return statistics.median(samples), samples[int(0.95 * (n - 1))]


def bench(report: Report, name: str, db_url: str, runs: int, steps: int) -> None:
    upgrade(db_url)
    t0 = time.perf_counter()
    ids = fill(db_url, runs, steps)
    report.add(f"{name}: {runs} runs x {steps} steps x {len(SUMMARY_KEYS)} keys stored",
               f"{time.perf_counter() - t0:.1f} s")  # fmt: skip
    deep = sorted(ids)[runs // 2]
    settings = Settings(database_url=db_url, ray_address="http://127.0.0.1:9", run_loops=False)
    with TestClient(create_app(settings), base_url="http://127.0.0.1") as api:

        def page(cursor: str | None = None) -> None:
            params = {"limit": 50} | ({"cursor": cursor} if cursor else {})
            resp = api.get("/runs", params=params)
            assert resp.status_code == 200 and len(resp.json()["items"]) == 50

        first = timed(page)
        middle = timed(lambda: page(deep))
    db = Database(db_url)
    page_ids = sorted(ids)[-50:]

    def summary() -> None:
        with db.transaction() as s:
            assert len(store.latest_of_runs(s, page_ids, SUMMARY_KEYS)) == 50

    alone = timed(summary)
    db.dispose()
    report.add(f"{name}: GET /runs?limit=50, first page",
               f"p50 {first[0]:.1f} ms p95 {first[1]:.1f} ms")  # fmt: skip
    report.add(f"{name}: the same, {runs // 2} runs deep",
               f"p50 {middle[0]:.1f} ms p95 {middle[1]:.1f} ms")  # fmt: skip
    report.add(f"{name}: the page's summary metrics query alone",
               f"p50 {alone[0]:.1f} ms ({alone[0] / first[0]:.0%} of the page)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--pg", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    parser.add_argument("--quick", action="store_true", help="small, in seconds (what CI runs)")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.steps = 200, 5
    report = Report("runs list")
    with tempfile.TemporaryDirectory() as tmp:
        bench(report, "sqlite", f"sqlite:///{Path(tmp) / 'bench.db'}", args.runs, args.steps)
    name = f"rlrun_bench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(args.pg, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        bench(report, "postgres", args.pg.rsplit("/", 1)[0] + f"/{name}", args.runs, args.steps)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
        admin.dispose()
    report.print()


if __name__ == "__main__":
    main()

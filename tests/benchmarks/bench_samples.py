"""Rollout samples benchmarks; prints figures. Run from the repo root:

    PYTHONPATH=$PWD python tests/benchmarks/bench_samples.py [page] [bound] [follow] [--quick]

- page: ``GET /runs/{id}/samples`` of a run holding 100,000 samples, over HTTP from a live
  server, while 4 other runs train and dump samples into the same database (as ``follow``):
  p50/p95 over 50 requests each of the first page, the first page with its per-step scores (the
  dashboard's first read), a step, a score range, one prompt, a deep cursor and a text, on
  SQLite and PostgreSQL (the goal: p95 <= 50 ms). ``--sqlite`` leaves PostgreSQL out.
- bound: 4 runs ship 1.5x their cap of samples through the follower's store; what each holds
  (samples, characters) against its stated bounds, and the ingest rate.
- follow: 4 runs training and dumping samples (64 samples of ~1.5 KB a step, a step per 0.5 s
  each: the follower's real parsing and store over growing logs; simulated Ray, since 4 real
  verl runs do not fit 2 cores), while a client reads ``GET /runs/{id}`` of the followed runs as
  fast as it can; the same without samples; the rate with them within 10 % of the rate without.

``--quick`` runs them at small sizes, in seconds (what CI runs).
"""

from __future__ import annotations

import contextlib
import json
import random
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, func, select

from jobs import samples as job
from service.app import create_app
from service.loops.follower import Follower
from service.metrics import samples
from service.metrics.health import HealthRules
from service.metrics.log_readers import TailReader
from service.settings import Settings
from service.store.db import Database, upgrade
from service.store.models import TEXT_SEARCH_INDEXES, RunLog, RunSample
from tests.benchmarks.bench_metrics import databases
from tests.benchmarks.report import Report
from tests.factories import add_run
from tests.fake_ray import FakeRay
from tests.live import ServerThread

WORDS = [
    "the",
    "of",
    "and",
    "to",
    "a",
    "in",
    "is",
    "that",
    "for",
    "it",
    "as",
    "was",
    "with",
    "be",
    "by",
    "on",
    "not",
    "he",
    "this",
    "are",
    "or",
]


def text(rng: random.Random, chars: int) -> str:
    out: list[str] = []
    size = 0
    while size < chars:
        word = rng.choice(WORDS)
        out.append(word)
        size += len(word) + 1
    return " ".join(out)[:chars]


def frames(rng: random.Random, step: int, n: int, prompts: int = 64, chars: int = 700) -> str:
    """A step's samples as the shipper prints them (Ray's actor prefix included)."""
    rows = []
    for i in range(n):
        p = i % prompts
        row = {"input": f"prompt {p}: " + text(random.Random(p), 300), "output": text(rng, chars),
               "gts": str(p), "score": rng.random(), "step": step, "acc": rng.random() > 0.5,
               "of": n}  # fmt: skip
        rows.append(f"(FullyAsyncTrainer pid=1) {job.PREFIX}{json.dumps(row)}\n")
    return "".join(rows)


def settings(url: str) -> Settings:
    return Settings(database_url=url, ray_address="http://127.0.0.1:9", run_loops=False)


def client(url: str) -> TestClient:
    return TestClient(create_app(settings(url)), base_url="http://127.0.0.1")


@contextlib.contextmanager
def training(url: str, runs: int = 4, dump: bool = True) -> Iterator[list[str]]:
    """``runs`` runs training meanwhile: a step each per 0.5 s (a metric line and, with
    ``dump``, 64 samples of ~1.5 KB), read and stored by the follower; their ids."""
    rng = random.Random(3)
    db = Database(url)
    ray = FakeRay()
    ids = [add_run(db, f"train-{uuid.uuid4().hex[:6]}") for _ in range(runs)]
    store = follower(db, ray, samples.Bounds())
    stop = threading.Event()

    def train() -> None:
        step = 0
        while not stop.is_set():
            step += 1
            for run_id in ids:
                add = f"step:{step} - critic/score/mean:{rng.random()} - actor/pg_loss:0.1\n"
                if dump:
                    add += frames(rng, step, 64, chars=1500)
                ray.log[run_id] = ray.log.get(run_id, "") + add
            store.tick()
            stop.wait(0.5)

    thread = threading.Thread(target=train, daemon=True)
    thread.start()
    try:
        yield ids
    finally:
        stop.set()
        thread.join()
        db.dispose()


def follower(db: Database, ray: FakeRay, bounds: samples.Bounds) -> Follower:
    return Follower(
        db, ray, "bench", 30, 8_000_000, HealthRules(), reader=TailReader(ray),
        sample_bounds=bounds,
    )  # fmt: skip


def timed(fn: Callable[[], object], n: int) -> tuple[float, float]:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    times.sort()
    return statistics.median(times) * 1000, times[int(0.95 * (n - 1))] * 1000


# A text held nowhere: every sample of the run is read, unless an index says so first.
RARE = "text held nowhere"
RARE_Q = "Zebra crossing"


def drop_text_indexes(url: str) -> None:
    engine = create_engine(url)
    with engine.begin() as conn:
        for name in TEXT_SEARCH_INDEXES:
            conn.exec_driver_sql(f"DROP INDEX IF EXISTS {name}")
        conn.exec_driver_sql("ANALYZE run_samples")
    engine.dispose()


def bench_page(report: Report, urls: list[tuple[str, str]], held: int, requests: int = 50) -> None:
    rng = random.Random(1)
    for label, url in urls:
        db = Database(url)
        run_id = f"page-{uuid.uuid4().hex[:6]}"
        add_run(db, run_id)
        per_step = 500
        bounds = samples.Bounds(per_step=1024, per_run=held, chars_per_run=10**10)
        t0 = time.perf_counter()
        with db.transaction() as s:
            runlog = RunLog(run_id=run_id, log_offset=0)
            s.add(runlog)
        for step in range(1, held // per_step + 1):
            # The store's own path (parse, bound, insert), a step per transaction.
            with db.transaction() as s:
                runlog = s.get(RunLog, run_id)
                assert runlog is not None
                lines = frames(rng, step, per_step, chars=300).splitlines()
                samples.ingest(s, runlog, samples.parse(lines), bounds)
        filled = time.perf_counter() - t0
        if url.startswith("postgresql"):  # as autovacuum does after a fill: the planner's view
            with db.transaction() as s:
                s.connection().exec_driver_sql("ANALYZE run_samples")
        with db.read() as s:
            kept = s.scalar(select(func.count()).where(RunSample.run_id == run_id))
            some = s.execute(select(RunSample.prompt_id, RunSample.id).limit(1)).one()
        db.dispose()
        report.add(f"fill {label}: {kept:,} samples through the store", f"{filled:.1f} s")
        deep = some[1] + held // 2
        with (
            ServerThread(create_app(settings(url))) as server,
            httpx.Client(base_url=server) as api,
            training(url),
        ):
            time.sleep(1.0)
            queries: list[tuple[str, dict[str, str | int]]] = [
                ("first page (50)", {}),
                ("first page and its steps", {"steps": "true"}),
                ("one step", {"step": held // per_step // 2}),
                ("score range", {"min_score": 0.9, "max_score": 0.95}),
                ("one prompt", {"prompt_id": some[0]}),
                ("deep cursor", {"cursor": deep}),
                ("text", {"q": "prompt 7:"}),
                (RARE, {"q": RARE_Q}),
            ]
            if url.startswith("postgresql"):  # what the trigram indexes buy
                queries.append((f"{RARE}, no trigram index", {"q": RARE_Q}))
            for name, params in queries:
                if name.endswith("no trigram index"):
                    drop_text_indexes(url)

                def get(params: dict[str, str | int] = params, path: str = run_id) -> None:
                    got = api.get(f"/runs/{path}/samples", params=params)
                    got.raise_for_status()
                    assert got.json()["items"] or "q" in params, params

                p50, p95 = timed(get, requests)
                goal = (
                    "" if "text" in name else (" (goal <= 50 ms)" if p95 <= 50 else " OVER 50 ms")
                )
                report.add(
                    f"/samples {label}, {kept:,} held, 4 runs training: {name}",
                    f"p50 {p50:.1f} ms, p95 {p95:.1f} ms{goal}",
                )


def bench_bound(
    report: Report, label: str, url: str, bounds: samples.Bounds, runs: int = 4
) -> None:
    rng = random.Random(2)
    db = Database(url)
    ray = FakeRay()
    ids = [add_run(db, f"bound-{uuid.uuid4().hex[:6]}") for _ in range(runs)]
    store = follower(db, ray, bounds)
    per_step = 64
    steps = int(bounds.per_run * 1.5) // per_step
    t0 = time.perf_counter()
    for step in range(1, steps + 1):
        for run_id in ids:
            ray.log[run_id] = ray.log.get(run_id, "") + frames(rng, step, per_step)
        store.tick()
    elapsed = time.perf_counter() - t0
    shipped = steps * per_step * runs
    with db.read() as s:
        for run_id in ids[:1]:
            runlog = s.get(RunLog, run_id)
            assert runlog is not None
            count, chars, newest, oldest = s.execute(
                select(
                    func.count(), func.sum(RunSample.chars), func.max(RunSample.step),
                    func.min(RunSample.step),
                ).where(RunSample.run_id == run_id)
            ).one()  # fmt: skip
            assert (count, chars) == (runlog.samples_kept, runlog.samples_chars)
            assert count <= bounds.per_run and chars <= bounds.chars_per_run and newest == steps
            report.add(
                f"bound {label}: a run shipped {steps * per_step:,} samples "
                f"(cap {bounds.per_run:,}, {bounds.chars_per_run:,} chars)",
                f"holds {count:,} samples, {chars:,} chars, steps {oldest}..{newest} "
                "(newest kept) - within its cap",
            )
    db.dispose()
    report.add(
        f"bound {label}: ingest, {runs} runs x {per_step} samples a step",
        f"{shipped / elapsed:,.0f} samples/s",
    )


def bench_follow(report: Report, url: str, seconds: float, runs: int = 4) -> None:
    rates = {}
    for mode in ("without samples", "with samples", "without samples again", "with samples again"):
        with training(url, runs, dump=mode.startswith("with ")) as ids, client(url) as api:
            api.get(f"/runs/{ids[0]}").raise_for_status()
            time.sleep(1.0)
            n = 0
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                api.get(f"/runs/{ids[n % runs]}").raise_for_status()
                n += 1
            rate = n / (time.perf_counter() - t0)
        db = Database(url)
        with db.read() as s:
            held = s.scalar(select(func.count()).where(RunSample.run_id.in_(ids)))
        db.dispose()
        rates[mode] = rate
        report.add(f"follow, {runs} runs training {mode}: GET /runs/{{id}}",
                   f"{rate:,.0f} req/s ({held:,} samples stored meanwhile)")  # fmt: skip
    without = (rates["without samples"] + rates["without samples again"]) / 2
    with_ = (rates["with samples"] + rates["with samples again"]) / 2
    change = (with_ - without) / without * 100
    verdict = "within 10 %" if change >= -10 else "OVER 10 % slower"
    report.add(
        "follow: GET /runs/{id} rate with samples vs without", f"{change:+.1f} % ({verdict})"
    )


@contextlib.contextmanager
def only_sqlite(tmp: Path) -> Iterator[list[tuple[str, str]]]:
    url = f"sqlite:///{tmp}/bench.db"
    upgrade(url)
    yield [("sqlite", url)]


def main() -> None:
    args = sys.argv[1:]
    quick = "--quick" in args
    parts = set(args) - {"--quick", "--sqlite"} or {"page", "bound", "follow"}
    report = Report("rollout samples")
    tmp = Path(f"/tmp/rlrun-bench-{uuid.uuid4().hex[:6]}")
    tmp.mkdir()
    with only_sqlite(tmp) if "--sqlite" in args else databases(tmp) as urls:
        if "page" in parts:
            bench_page(report, urls, *((1_000, 10) if quick else (100_000, 50)))
        if "bound" in parts:
            bounds = samples.Bounds()
            if quick:
                bounds = samples.Bounds(per_step=1024, per_run=200, chars_per_run=150_000)
            for label, url in urls[:1] if quick else urls:
                bench_bound(report, label, url, bounds)
    if "follow" in parts:
        url = f"sqlite:///{tmp}/follow.db"
        upgrade(url)
        bench_follow(report, url, 1.0 if quick else 15.0)
    report.print()


if __name__ == "__main__":
    main()

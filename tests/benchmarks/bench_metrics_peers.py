"""Metrics side by side with an MLflow tracking server (SQLite backend), in one run; prints a
table with the ratios. From the repo root:

    PYTHONPATH=$PWD python -m tests.benchmarks.bench_metrics_peers [--steps 100000]
        [--grow-to 1000000] [--sse-runs 20] [--sse-clients 200] [--sse-seconds 20] [--no-sse]
        [--ingest-only] [--quick]

``--ingest-only`` times ingest alone (both databases and MLflow, in turn); ``--quick`` runs
every part at a small size in seconds, the live part on SQLite only (what CI runs). Without
``mlflow`` installed (the ``bench`` extra) the MLflow column is left empty and the output says so.

Both servers run as child processes on 127.0.0.1 and are read over HTTP with keep-alive. The
service's points are stored at the store level in batches of 100 steps x 10 keys (1,000 points,
the size of one MLflow ``log-batch``, its largest), on SQLite and on PostgreSQL; MLflow holds one
key of the same steps (its reads take one key a call). The live part runs synthetic
job logs through the real follower in the service process (real Ray jobs for 20 runs do not fit
two cores), each line carrying the time it was printed.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import func, select, text

from service.metrics import store
from service.metrics.parse import MetricLine
from service.store.db import Database
from service.store.models import MetricPoint
from tests.benchmarks.bench_metrics import databases
from tests.factories import add_run
from tests.live import free_port
from tests.service_process import ServiceProcess

KEY = "critic/score/mean"
KEYS = [
    KEY,
    "critic/score/max",
    "critic/rewards/mean",
    "actor/pg_loss",
    "actor/entropy",
    "actor/grad_norm",
    "response_length/mean",
    "fully_async/trainer/idle_ratio",
    "fully_async/count/stale_trajectory_processed",
    "timing_s/step",
]
BATCH_STEPS = 100  # x 10 keys = one 1,000-metric MLflow log-batch


@dataclass
class Row:
    goal: str
    db: str
    ours: float
    peer: float | None = None
    unit: str = "ms"

    def ratio(self) -> str:
        if self.peer is None or not self.ours:
            return ""
        # How many times better than the peer: faster (ms) or more (points/s).
        times = self.ours / self.peer if self.unit == "points/s" else self.peer / self.ours
        return f"{times:.1f}x"


def _value(key: int, step: int) -> float:
    return ((step * 7919 + key * 104_729) % 1000) / 1000


# Seconds one paired measure may take past its first 3 rounds (``--quick``: none).
PAIRED_BUDGET_S = 8.0


def paired_ms(
    ours: Callable[[], Any], peer: Callable[[], Any] | None, repeat: int, budget_s: float = 0.0
) -> tuple[float, float | None]:
    """Medians of ``ours`` and ``peer`` called in turn (both meet the same load on a shared
    machine): up to ``repeat`` rounds after a warm-up of ``ours``, at least 3, within a budget
    (``PAIRED_BUDGET_S`` unless given)."""
    budget_s = budget_s or PAIRED_BUDGET_S
    ours()
    mine: list[float] = []
    theirs: list[float] = []
    while len(mine) < repeat and (len(mine) < 3 or sum(mine) + sum(theirs) < budget_s):
        for call, times in ((ours, mine), (peer, theirs)):
            if call is not None:
                t0 = time.perf_counter()
                call()
                times.append(time.perf_counter() - t0)
    return statistics.median(mine) * 1000, statistics.median(theirs) * 1000 if theirs else None


class Mlflow:
    """A local MLflow tracking server (SQLite backend) with one experiment and one run."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.db_path = workdir / "mlflow.db"
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.http = httpx.Client(base_url=self.url, timeout=600)
        self.run_id = self.experiment = ""
        self.points = 0

    def __enter__(self) -> Mlflow:
        log = open(self.workdir / "mlflow.log", "wb")  # the child's, kept open while it runs
        self.proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "mlflow", "server"),
                *("--backend-store-uri", f"sqlite:///{self.db_path}"),
                *("--default-artifact-root", str(self.workdir / "artifacts")),
                *("--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its uvicorn child goes down with it
        )
        deadline = time.monotonic() + 180
        while True:
            try:
                if self.http.get("/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"MLflow did not start; see {self.workdir / 'mlflow.log'}")
            time.sleep(0.5)
        self.experiment = self._post("experiments/create", {"name": "bench"})["experiment_id"]
        return self

    def new_run(self) -> None:
        body = {"experiment_id": self.experiment}
        self.run_id = self._post("runs/create", body)["run"]["info"]["run_id"]

    def __exit__(self, *exc: object) -> None:
        self.http.close()
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        resp = self.http.post(f"/api/2.0/mlflow/{path}", json=body)
        resp.raise_for_status()
        return resp.json()

    def log_batch(self, metrics: list[tuple[str, int, float]]) -> None:
        self.points += len(metrics)
        now = int(time.time() * 1000)
        self._post(
            "runs/log-batch",
            {
                "run_id": self.run_id,
                "metrics": [
                    {"key": k, "step": s, "value": v, "timestamp": now} for k, s, v in metrics
                ],
            },
        )

    def sampled(self, key: str, points: int) -> int:
        """The UI's downsampled history call."""
        resp = self.http.get(
            "/ajax-api/2.0/mlflow/metrics/get-history-bulk-interval",
            params={"run_ids": self.run_id, "metric_key": key, "max_results": points},
        )
        resp.raise_for_status()
        return len(resp.json()["metrics"])

    def history(self, key: str) -> int:
        """Every point through the paged ``get-history`` (25,000 a page, its largest)."""
        got, token = 0, None
        while True:
            params: dict[str, Any] = {"run_id": self.run_id, "metric_key": key}
            params |= {"max_results": 25_000} | ({"page_token": token} if token else {})
            body = self.http.get("/api/2.0/mlflow/metrics/get-history", params=params).json()
            got += len(body.get("metrics", []))
            token = body.get("next_page_token")
            if not token:
                return got

    def bytes_on_disk(self) -> int:
        return sum(p.stat().st_size for p in self.workdir.glob("mlflow.db*"))


def mlflow_installed() -> bool:
    return importlib.util.find_spec("mlflow") is not None


def fill(
    db: Database, run_id: str, keys: Sequence[str], start: int, stop: int, mlflow: Mlflow | None
) -> tuple[float, float | None]:
    """Store steps ``[start, stop)`` of ``keys``, 100 steps a transaction, and the same steps of
    one key into MLflow 1,000 a ``log-batch`` (its largest), in turn; points/s of each."""
    ours = peer = 0.0
    for lo in range(start, stop, BATCH_STEPS):
        batch = [
            (s + 1, MetricLine(s, {k: _value(i, s) for i, k in enumerate(keys)}))
            for s in range(lo, min(stop, lo + BATCH_STEPS))
        ]
        t0 = time.perf_counter()
        with db.transaction() as session:
            store.add_lines(session, run_id, batch)
        ours += time.perf_counter() - t0
        if mlflow is not None and lo % 1000 == 0:
            t0 = time.perf_counter()
            mlflow.log_batch([(KEY, s, _value(0, s)) for s in range(lo, min(stop, lo + 1000))])
            peer += time.perf_counter() - t0
    points = (stop - start) * len(keys)
    return points / ours, (stop - start) / peer if mlflow is not None else None


def bytes_per_point(db: Database) -> float:
    """Bytes on disk for the metric tables and their indexes, per stored point."""
    tables = ("metric_points", "metric_keys", "metric_buckets")
    with db.transaction() as s:
        points = s.scalar(select(func.count()).select_from(MetricPoint)) or 1
        if s.get_bind().dialect.name == "postgresql":
            names = [t for t in tables if s.scalar(text(f"SELECT to_regclass('{t}')"))]
            size = sum(s.scalar(text(f"SELECT pg_total_relation_size('{t}')")) for t in names)
        else:
            # dbstat names each table and index; a table's indexes start with "ix_"/"sqlite_".
            rows = s.execute(text("SELECT name, tbl_name FROM sqlite_master")).all()
            mine = {n for n, t in rows if t in tables}
            size = sum(
                s.scalar(text("SELECT sum(pgsize) FROM dbstat WHERE name = :n"), {"n": n}) or 0
                for n in mine
            )
    return float(size) / points


def _params(keys: Sequence[str], points: int) -> dict[str, Any]:
    return {"keys": ",".join(keys), "max_points": points}


def new_filled_run(
    db: Database, mlflow: Mlflow | None, steps: int
) -> tuple[str, float, float | None]:
    """A new run (and MLflow's, beside it) filled with ``steps`` steps of ``KEYS``: its id and
    ``fill``'s rates."""
    run_id = f"r{uuid.uuid4().hex[:20]}"
    add_run(db, run_id)
    if mlflow is not None:
        mlflow.new_run()
    ingest, peer = fill(db, run_id, KEYS, 0, steps, mlflow)
    return run_id, ingest, peer


def bench_ingest(label: str, url: str, mlflow: Mlflow | None, steps: int) -> list[Row]:
    """Ingest alone: a new run filled with ``steps`` steps, beside MLflow's ``log-batch``."""
    db = Database(url)
    _, ingest, peer = new_filled_run(db, mlflow, steps)
    db.dispose()
    goal = f"ingest, {BATCH_STEPS * len(KEYS):,} points a batch"
    return [Row(goal, label, ingest, peer, "points/s")]


def bench_database(
    label: str, url: str, workdir: Path, mlflow: Mlflow | None, steps: int, grow_to: int
) -> list[Row]:
    db = Database(url)
    run_id, ingest, peer_ingest = new_filled_run(db, mlflow, steps)
    service = ServiceProcess(url, "http://127.0.0.1:9", workdir / f"service-{label}.log")
    service.env["RLRUN_RUN_LOOPS"] = "false"
    service.start()
    rows: list[Row] = []
    try:
        http = httpx.Client(base_url=service.url, timeout=600)
        metrics = f"/runs/{run_id}/metrics"

        def ours(keys: Sequence[str], points: int) -> Callable[[], Any]:
            return lambda: http.get(metrics, params=_params(keys, points)).raise_for_status()

        def run() -> None:
            http.get(f"/runs/{run_id}").raise_for_status()

        def peer(call: Callable[[], Any]) -> Callable[[], Any] | None:
            return None if mlflow is None else call

        sampled_points = min(1000, steps)
        got = http.get(metrics, params=_params([KEY], 1000)).json()["series"][KEY]
        print(f"{label}: 1 key of {steps:,} steps -> {len(got)} points")
        assert mlflow is None or mlflow.sampled(KEY, 1000) == sampled_points
        one, sampled = paired_ms(ours([KEY], 1000), peer(lambda: mlflow.sampled(KEY, 1000)), 20)
        full, paged = paired_ms(ours([KEY], steps), peer(lambda: mlflow.history(KEY)), 3)

        def sampled_keys() -> None:  # MLflow's call takes one key: ten keys are ten calls
            for _ in KEYS:
                mlflow.sampled(KEY, 1000)

        ten, sampled_ten = paired_ms(ours(KEYS, 1000), peer(sampled_keys), 10)
        rows += [
            Row(f"1 key, {steps:,} steps -> 1,000 points", label, one, sampled),
            Row(f"full {steps:,} points of 1 key", label, full, paged),
            Row(f"{len(KEYS)} keys -> 1,000 points each", label, ten, sampled_ten),
            Row(f"{len(KEYS)} keys / 1 key", label, ten / one, unit="x"),
            Row(
                f"GET /runs/{{id}}, {steps * len(KEYS):,} points",
                label,
                paired_ms(run, None, 20)[0],
            ),
            Row(
                f"ingest, {BATCH_STEPS * len(KEYS):,} points a batch",
                label,
                ingest,
                peer_ingest,
                "points/s",
            ),
        ]
        if grow_to > steps:
            fill(db, run_id, [KEY], steps, grow_to, None)
            rows += [
                Row(
                    f"1 key, {grow_to:,} steps -> 1,000 points",
                    label,
                    paired_ms(ours([KEY], 1000), None, 20)[0],
                ),
                Row(
                    f"GET /runs/{{id}}, {steps * (len(KEYS) - 1) + grow_to:,} points",
                    label,
                    paired_ms(run, None, 20)[0],
                ),
            ]
        # MLflow's figure: its whole SQLite file per point (it keeps latest values too).
        peer_bytes = None if mlflow is None else mlflow.bytes_on_disk() / mlflow.points
        rows.append(Row("bytes per stored point", label, bytes_per_point(db), peer_bytes, "B"))
        http.close()
    finally:
        service.stop()
        db.dispose()
    return rows


SERVER = """
import sys, time, threading, uvicorn
from service.app import create_app
from service.settings import Settings
from service.loops.follower import Follower
from service.metrics.health import HealthRules
from service.metrics.log_readers import WholeLogReader

url, port, t0, every = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
ids = sys.argv[5].split(",")
phase = {r: every * i / len(ids) for i, r in enumerate(ids)}
logs = {r: [] for r in ids}

class SyntheticRay:
    # Each run's job log grows by one 100-key metric line every ``every`` seconds, each line
    # carrying the time it was printed.
    def logs(self, run_id):
        if run_id not in logs:
            return None  # a run of another benchmark
        lines = logs[run_id]
        while True:
            printed = t0 + phase[run_id] + every * len(lines)
            if printed > time.time():
                return "".join(lines)
            step = len(lines) + 1
            lines.append(
                f"(FullyAsyncTrainer pid=1, ip=10.0.0.1) step:{step} - "
                f"bench/printed_at:{printed!r} - "
                + " - ".join(f"k/{k}:{step * 0.1 + k}" for k in range(99)) + "\\n"
            )

app = create_app(Settings(database_url=url, ray_address="http://127.0.0.1:9", run_loops=False))
def loop():
    while not hasattr(app.state, "services"):  # built when the server starts
        time.sleep(0.05)
    services = app.state.services
    ray = SyntheticRay()
    follower = Follower(
        services.db, ray, "bench", 15, 8_000_000, HealthRules(), services.broker.notify,
        reader=WholeLogReader(ray),  # the log read whole every tick: no tail stream to hold
    )
    interval = services.settings.follow_interval_s
    while True:
        started = time.monotonic()
        follower.tick()
        time.sleep(max(0.0, interval - (time.monotonic() - started)))
threading.Thread(target=loop, daemon=True).start()
uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
"""


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench_live(
    label: str,
    url: str,
    workdir: Path,
    runs: int,
    clients: int,
    seconds: float,
    every: float = 1.0,
    warm_up: float = 5.0,
) -> list[Row]:
    """``clients`` SSE clients over ``runs`` live runs: printed line -> client, service CPU."""
    db = Database(url)
    ids = [f"live-{uuid.uuid4().hex[:8]}" for _ in range(runs)]
    for run_id in ids:
        add_run(db, run_id)
    db.dispose()
    port = free_port()
    log = open(workdir / f"live-{label}.log", "wb")  # noqa: SIM115 (the child's, until it ends)
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER, url, str(port), str(time.time()), str(every), ",".join(ids)],
        env=os.environ | {"PYTHONPATH": os.getcwd()},
        stderr=log,
    )
    delays: list[float] = []
    measuring = False
    window = [0.0]

    async def client(run_id: str, http: httpx.AsyncClient) -> None:
        url = f"http://127.0.0.1:{port}/runs/{run_id}/events?since=now"
        async with http.stream("GET", url) as resp:
            kind = ""
            async for line in resp.aiter_lines():
                if line.startswith("event:"):
                    kind = line[6:].strip()
                elif line.startswith("data:") and kind == "metrics" and measuring:
                    printed = float(line.split('"bench/printed_at":', 1)[1].split(",", 1)[0])
                    if printed >= window[0]:  # a line printed while measuring, not a replay
                        delays.append(time.time() - printed)

    async def main() -> tuple[float, float]:
        nonlocal measuring
        async with httpx.AsyncClient(timeout=None, limits=httpx.Limits(max_connections=None)) as h:
            while True:
                try:
                    (await h.get(f"http://127.0.0.1:{port}/healthz")).raise_for_status()
                    break
                except httpx.HTTPError:
                    if proc.poll() is not None:
                        raise RuntimeError(f"the live server exited; see {log.name}") from None
                    await asyncio.sleep(0.2)
            tasks = [asyncio.create_task(client(ids[i % runs], h)) for i in range(clients)]
            await asyncio.sleep(warm_up)
            measuring, window[0] = True, time.time()
            c0, w0 = cpu_seconds(proc.pid), time.monotonic()
            await asyncio.sleep(seconds)
            c1, w1 = cpu_seconds(proc.pid), time.monotonic()
            measuring = False
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            return c1 - c0, w1 - w0

    try:
        cpu, wall = asyncio.run(main())
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()
    delays.sort()
    goal = f"{clients} SSE clients, {runs} live runs (100 keys/s each)"
    expected = clients * seconds / every
    print(f"{label}: {len(delays)} metric events received of about {expected:.0f} printed")
    p95 = delays[int(len(delays) * 0.95)] * 1000 if delays else math.nan
    return [
        Row(f"{goal}: p95 print -> client", label, p95),
        Row(f"{goal}: service CPU", label, cpu / wall * 100, unit="% core"),
    ]


def print_table(rows: list[Row]) -> None:
    print(f"\n| {'measure':58s} | {'db':8s} | {'rlrun':>12s} | {'MLflow':>12s} | ratio |")
    print(f"|{'-' * 60}|{'-' * 10}|{'-' * 14}|{'-' * 14}|-------|")
    for r in rows:
        fmt = "{:,.0f} " if r.unit in ("points/s", "B", "% core") or r.ours >= 100 else "{:.1f} "
        ours = fmt.format(r.ours) + r.unit
        peer = "" if r.peer is None else fmt.format(r.peer) + r.unit
        print(f"| {r.goal:58s} | {r.db:8s} | {ours:>12s} | {peer:>12s} | {r.ratio():>5s} |")


def budget(rows: list[Row]) -> None:
    for r in rows:
        if r.goal == "bytes per stored point":
            gib = r.ours * 1_000_000 * 100 / 2**30
            print(f"storage, {r.db}: 1,000,000 steps x 100 keys = {gib:,.1f} GiB")


@contextmanager
def _workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="rlrun-peers-") as tmp:
        yield Path(tmp)


def main(argv: Sequence[str] | None = None) -> list[Row]:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--grow-to", type=int, default=1_000_000)
    parser.add_argument("--sse-runs", type=int, default=20)
    parser.add_argument("--sse-clients", type=int, default=200)
    parser.add_argument("--sse-seconds", type=float, default=20)
    parser.add_argument("--no-sse", action="store_true")
    parser.add_argument("--ingest-only", action="store_true")
    parser.add_argument("--quick", action="store_true", help="every part, small, in seconds")
    args = parser.parse_args(argv)
    warm_up = 5.0
    if args.quick:
        global PAIRED_BUDGET_S
        args.steps, args.grow_to, warm_up, PAIRED_BUDGET_S = 2_000, 0, 1.0, 1e-9
        args.sse_runs, args.sse_clients, args.sse_seconds = 2, 4, 2.0
    rows: list[Row] = []
    with _workdir() as workdir, databases(workdir) as urls, _mlflow(workdir) as mlflow:
        where = "not installed (pip install -e '.[bench]'): its column is empty"
        where = f"at {mlflow.url}" if mlflow is not None else where
        print(f"MLflow {where}; the service on {', '.join(label for label, _ in urls)}")
        for label, url in urls:
            if args.ingest_only:
                rows += bench_ingest(label, url, mlflow, args.steps)
            else:
                rows += bench_database(label, url, workdir, mlflow, args.steps, args.grow_to)
        if not (args.no_sse or args.ingest_only):
            for label, url in urls[:1] if args.quick else urls:  # quick: the live part on SQLite
                rows += bench_live(
                    label,
                    url,
                    workdir,
                    args.sse_runs,
                    args.sse_clients,
                    args.sse_seconds,
                    warm_up=warm_up,
                )
    print_table(rows)
    budget(rows)
    return rows


@contextmanager
def _mlflow(workdir: Path) -> Iterator[Mlflow | None]:
    """An MLflow server when ``mlflow`` is installed, else None."""
    if not mlflow_installed():
        yield None
        return
    with Mlflow(workdir) as mlflow:
        yield mlflow


if __name__ == "__main__":
    main()

"""rlrun's API side by side with a peer's own API (Ray's job REST API), in one run.

    python -m tests.benchmarks.bench_peers [--seconds 3] [--clients 1,16,64] [--db sqlite,postgres]
        [--read-cache-s 1] [--auth] [--rows accept,distinct] [--rounds 1] [--quick]

``--quick``: 0.3 s per cell at 16 clients on SQLite, every row in two rounds, the big run holding
100 steps, Ray holding 10 jobs (what CI runs). ``--rows``: only the rows whose name contains one of
these words.

The service runs as deployed (uvicorn child process, one worker, background loops off) with Ray
unreachable, so only its own path counts; the peer is the dashboard of a local Ray head started
here. Each row is measured at each client count, first one side, then the other, each while the
other is idle; the table gives requests per second, p50 and the ratio of req/s (rlrun / peer).
``--rounds N`` measures each cell N times, the sides taking turns: a cell shows each side's
median round and the median of the rounds' ratios with their range (the machine's noise, seen).

Rows (a section per database): a no-op (``GET /healthz`` / ``GET /api/version``: what each
server's HTTP stack costs alone), accept a run (``POST /runs`` / ``POST /api/jobs/``, Ray's jobs
wait for a resource no node has, so no process is started), read one run (``GET /runs/{id}``,
also for a run with 1,000,000 stored metric points, / ``GET /api/jobs/{id}``), list 100
(``GET /runs?limit=100`` / ``GET /api/jobs/`` holding 100 jobs), read 100 distinct runs once each
(a pass over 100 runs / 100 jobs, repeated after the kept answers lapse, so every read is a
miss), read 4 followed runs (``GET /runs/{id}`` round 4 runs that run on the Ray head, printing a
metric line every second that the service's follower stores / ``GET /api/jobs/{id}`` of the same 4
jobs; that service runs its loops on a database of its own). Accepting runs last keeps the
peer's listing at 100 jobs for the other rows. Each job Ray accepts stays pending, watched by
its job manager (some 0.3 of a core for 300 of them, for as long as they are there): so every
accept cell of the service's, in every section, is measured before any of Ray's, in one round,
and no cell of ours runs beside the work Ray's accepts left. ``--quick``: a fraction of a second
per cell, 16 clients, SQLite, 10,000 points instead of 1,000,000: it shows that every row runs,
not what it measures.
Repeated reads of one run or page are answered from the service's read cache; with
``--read-cache-s 0`` nothing is kept (requests that arrive while a read is
under way still share it).

Ray's head always checks a token (``RAY_AUTH_MODE=token``); ``--auth`` has the service check
one as well (an API token, looked up on every request, as deployed), so both sides pay for their
auth; without it the service runs in open mode.

Another peer adds a section: a function ``(ExitStack, args) -> Section`` (set-up registered
on the stack) passed to ``run`` with the others.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx

from service.metrics import store
from service.metrics.parse import MetricLine
from service.store import tokens
from service.store.db import Database
from tests import postgres
from tests.benchmarks import report
from tests.benchmarks.bench_metrics import databases
from tests.conftest import wait_for
from tests.service_process import ServiceProcess

RAY_PORT = int(os.environ.get("RLRUN_TEST_RAY_PORT", "20379")) + 300
RUN_SPEC = {"recipe": "tiny-grpo", "name": "bench", "team": "bench"}
# A resource no node has: Ray accepts the job and keeps it PENDING without starting anything.
RAY_JOB = {"entrypoint": "true", "entrypoint_resources": {"bench_never": 1}}
POINTS_KEYS, POINTS_STEPS = 100, 10_000  # 1,000,000 points
# Runs that print a metric line every second while the service follows them (tests/recipes.py).
FOLLOWED_SPEC = {"recipe": "test-metrics", "seconds": 3600, "every_s": 1.0}
FOLLOWED = 4
RAY_JOBS = 100  # what Ray's job list holds


@dataclass(frozen=True)
class Target:
    """One side of a row: requests ``(method, url path, json body)`` answered with ``ok``."""

    base_url: str
    method: str
    path: str
    body: dict[str, Any] | None = None
    ok: int = 200
    # More paths: the requests go round ``path`` and these.
    more: tuple[str, ...] = ()
    # What opens the connections before a pass of each path once (``Row.passes``).
    warm: str = "/"
    # What authenticates to the peer (Ray's token).
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def paths(self) -> tuple[str, ...]:
        return (self.path, *self.more)


@dataclass(frozen=True)
class Row:
    what: str
    ours: Target
    peer: Target
    # Each path once per pass (not for a time), ``passes`` times ``pause_s`` apart.
    passes: int = 0
    pause_s: float = 0.0
    # The peer's cells leave it work that outlasts them (each job Ray accepts stays pending,
    # watched by its job manager: some 0.3 of a core for 300 of them, for as long as they are
    # there). Every cell of ours is then measured before any of the peer's, in one round.
    peer_keeps_working: bool = False


@dataclass
class Section:
    title: str
    peer: str
    rows: list[Row]


@dataclass(frozen=True)
class Result:
    count: int
    errors: int
    req_s: float
    p50_ms: float
    p99_ms: float

    def cell(self) -> str:
        if not self.count:
            return f"no answer ({self.errors} errors)"
        bad = f", {self.errors} errors" if self.errors else ""
        return f"{self.req_s:,.0f}/s, p50 {self.p50_ms:.1f} ms{bad}"


async def _drive(target: Target, clients: int, seconds: float, warmup: float = 0.5) -> Result:
    """``clients`` connections, each sending its next request as soon as the last is answered;
    counted: the answers that arrive within ``seconds`` after the warm-up. Requests still out
    at the end are waited for (not counted), so the next measurement starts on an idle server."""
    latencies: list[float] = []
    errors = 0
    timeout = aiohttp.ClientTimeout(total=300)
    connector = aiohttp.TCPConnector(limit=clients)
    paths = itertools.cycle(target.paths)
    async with aiohttp.ClientSession(
        target.base_url, timeout=timeout, connector=connector, headers=target.headers
    ) as s:
        start = time.perf_counter()
        measure_from, stop_at = start + warmup, start + warmup + seconds

        async def client() -> None:
            nonlocal errors
            while (t0 := time.perf_counter()) < stop_at:
                path = next(paths)
                try:
                    async with s.request(target.method, path, json=target.body) as resp:
                        await resp.read()
                        good = resp.status == target.ok
                except (aiohttp.ClientError, TimeoutError):
                    good = False
                t1 = time.perf_counter()
                if measure_from <= t1 <= stop_at:
                    if good:
                        latencies.append(t1 - t0)
                    else:
                        errors += 1

        await asyncio.gather(*(client() for _ in range(clients)))
    return _result(latencies, errors, seconds)


def _result(latencies: list[float], errors: int, seconds: float) -> Result:
    """Answers a second over ``seconds``, with p50 and p99 in ms, of the good answers."""
    latencies.sort()
    if not latencies:
        return Result(0, errors, 0.0, 0.0, 0.0)
    return Result(
        len(latencies),
        errors,
        len(latencies) / seconds,
        statistics.median(latencies) * 1000,
        latencies[int(len(latencies) * 0.99)] * 1000,
    )


def measure(target: Target, clients: int, seconds: float) -> Result:
    return asyncio.run(_drive(target, clients, seconds))


async def _drive_once(target: Target, clients: int) -> tuple[list[float], int, float]:
    """Each path requested once by ``clients`` connections; latencies, errors, wall time."""
    latencies: list[float] = []
    errors = 0
    paths = iter(target.paths)
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(
        target.base_url, connector=connector, headers=target.headers
    ) as s:
        # Connections opened before the clock starts, as in a timed cell after its warm-up.
        await asyncio.gather(*(s.get(target.warm) for _ in range(clients)))
        start = time.perf_counter()

        async def client() -> None:
            nonlocal errors
            for path in paths:
                t0 = time.perf_counter()
                try:
                    async with s.request(target.method, path, json=target.body) as resp:
                        await resp.read()
                        good = resp.status == target.ok
                except aiohttp.ClientError:
                    good = False
                if good:
                    latencies.append(time.perf_counter() - t0)
                else:
                    errors += 1

        await asyncio.gather(*(client() for _ in range(clients)))
        return latencies, errors, time.perf_counter() - start


def measure_once(target: Target, clients: int, passes: int, pause_s: float) -> Result:
    """``passes`` passes of each path once, ``pause_s`` apart (not counted)."""
    latencies: list[float] = []
    errors, elapsed = 0, 0.0
    for n in range(passes):
        if n:
            time.sleep(pause_s)
        got, bad, took = asyncio.run(_drive_once(target, clients))
        latencies += got
        errors += bad
        elapsed += took
    return _result(latencies, errors, elapsed)


def run(
    sections: Sequence[Callable[[ExitStack, argparse.Namespace], Section]],
    args: argparse.Namespace,
) -> None:
    """Set every section up, then measure row by row (the n-th row of each section, at each
    client count, before any n+1-th row), so that rows that add data come last everywhere."""
    counts = [int(c) for c in args.clients.split(",")]
    with ExitStack() as stack:
        built = [make(stack, args) for make in sections]
        if args.rows:
            for section in built:
                section.rows = [r for r in section.rows if any(w in r.what for w in args.rows)]
        tables: dict[int, list[str]] = {id(s): [] for s in built}
        for index in range(max(len(s.rows) for s in built)):
            cells = [
                (section, section.rows[index], clients)
                for clients in counts
                for section in built
                if index < len(section.rows)
            ]
            for section, line in _measure_cells(cells, args.seconds, args.rounds):
                print(f"{section.title}: {line}", flush=True)
                tables[id(section)].append(line)
    turns = ""
    if args.rounds > 1:
        turns = f"; {args.rounds} rounds each side in turn: the median round, the ratios' range"
    print(f"\n{args.seconds:g} s per cell; ratio = rlrun req/s / peer req/s{turns}")
    for section in built:
        print(f"\n### {section.title}\n")
        print(f"| what | clients | rlrun | {section.peer} | ratio |")
        print("| --- | --- | --- | --- | --- |")
        print("\n".join(tables[id(section)]))


Cell = tuple[Section, Row, int]


def _measure_cells(
    cells: Sequence[Cell], seconds: float, rounds: int
) -> Iterator[tuple[Section, str]]:
    """Each cell's line: one side, then the other, ``rounds`` times (each side's median round
    by req/s, the median of the rounds' ratios with their range past one round); for a row
    whose peer keeps working, every cell of ours first, then the peer's, in one round."""
    results: dict[int, tuple[list[Result], list[Result]]] = {id(c): ([], []) for c in cells}
    if any(row.peer_keeps_working for _, row, _ in cells):
        passes, turns = ((0,), (1,)), 1  # every cell of ours, then every cell of the peer's
    else:
        passes, turns = ((0, 1),), rounds  # each cell's sides in turn
    for sides in passes:
        for cell in cells:
            for _ in range(turns):
                for side in sides:
                    results[id(cell)][side].append(_measure(cell, side, seconds))
            if 1 in sides:  # the peer's done too: the cell's line
                yield cell[0], _line(cell, *results[id(cell)])


def _measure(cell: Cell, side: int, seconds: float) -> Result:
    _, row, clients = cell
    target = (row.ours, row.peer)[side]
    if row.passes:
        return measure_once(target, clients, row.passes, row.pause_s)
    return measure(target, clients, seconds)


def _line(cell: Cell, ours: list[Result], peer: list[Result]) -> str:
    _, row, clients = cell
    ratios = sorted(
        o.req_s / p.req_s for o, p in zip(ours, peer, strict=True) if o.req_s and p.req_s
    )
    ratio = f"{statistics.median(ratios):.1f}x" if ratios else "—"
    if len(ratios) > 1:
        ratio += f" ({ratios[0]:.1f}-{ratios[-1]:.1f})"
    return f"| {row.what} | {clients} | {_median(ours).cell()} | {_median(peer).cell()} | {ratio} |"


def _median(results: list[Result]) -> Result:
    return sorted(results, key=lambda r: r.req_s)[(len(results) - 1) // 2]


# --- rlrun against Ray's job API ---------------------------------------------------------------


def ray_head(stack: ExitStack, args: argparse.Namespace) -> tuple[str, list[str], dict[str, str]]:
    """A local Ray head holding 100 pending jobs; its address, the jobs' ids and the headers
    that authenticate to it (made once)."""
    if not hasattr(args, "ray"):
        address = stack.enter_context(report.ray_head([8], 4, RAY_PORT))
        headers = report.ray_headers(address)
        with httpx.Client(base_url=address, headers=headers, timeout=30) as http:
            ids = [
                http.post("/api/jobs/", json=RAY_JOB).json()["submission_id"]
                for _ in range(RAY_JOBS)
            ]
        args.ray = (address, ids, headers)
    head: tuple[str, list[str], dict[str, str]] = args.ray
    return head


def secured(service: ServiceProcess, db_url: str, auth: bool) -> dict[str, str]:
    """With ``auth``: the service started with token checks on, and the headers of an admin
    token made in its database (no headers without)."""
    if not auth:
        service.start()
        return {}
    # One caller sends every request: no per-caller or per-team limit may refuse it.
    service.env |= {
        "RLRUN_AUTH": "on",
        "RLRUN_VALIDATIONS_PER_CALLER": "100000",
        "RLRUN_RUNS_PER_TEAM_PER_MINUTE": "0",
    }
    service.start()
    db = Database(db_url)
    try:
        with db.transaction() as s:
            _row, secret = tokens.create(s, "bench", "bench", "admin", "bench")
    finally:
        db.dispose()
    return {"Authorization": f"Bearer {secret}"}


def service_on(
    stack: ExitStack,
    db_url: str,
    workdir: Path,
    read_cache_s: float = 1.0,
    points_steps: int = POINTS_STEPS,
    auth: bool = False,
) -> tuple[str, list[str], dict[str, str]]:
    """The service on ``db_url`` with 100 runs, the second holding ``POINTS_KEYS`` x
    ``points_steps`` metric points; its URL, the runs' ids and the headers to send it."""
    service = ServiceProcess(db_url, "http://127.0.0.1:9", workdir / f"{uuid.uuid4().hex}.log")
    service.env["RLRUN_RUN_LOOPS"] = "false"
    service.env["RLRUN_READ_CACHE_S"] = str(read_cache_s)
    headers = secured(service, db_url, auth)
    stack.callback(service.stop)
    with httpx.Client(base_url=service.url, timeout=30, headers=headers) as http:
        ids = [http.post("/runs", json=RUN_SPEC).json()["id"] for _ in range(100)]
    db = Database(db_url)
    keys = [*store.LATEST_KEYS, "val-core/geo3k/reward/acc/mean@1"]
    keys += [f"bench/key_{i}" for i in range(POINTS_KEYS - len(keys))]
    for lo in range(0, points_steps, 500):
        with db.transaction() as s:
            lines = [
                (step, MetricLine(step, dict.fromkeys(keys, step / 7)))
                for step in range(lo, min(lo + 500, points_steps))
            ]
            store.add_lines(s, ids[1], lines)
    db.dispose()
    return service.url, ids, headers


def followed_service(
    stack: ExitStack, db: str, args: argparse.Namespace, ray_url: str
) -> tuple[str, list[str], dict[str, str]]:
    """The service with its loops on, on a database of its own, running ``FOLLOWED`` runs on
    the Ray head that print a metric line every second (its follower stores each); its URL,
    the runs' ids, once each run has stored a few steps, and the headers to send it."""
    if db == "sqlite":
        db_url = f"sqlite:///{args.workdir}/followed-{uuid.uuid4().hex[:6]}.db"
    else:
        admin = stack.enter_context(postgres.admin_url())
        db_url = stack.enter_context(postgres.fresh_database(admin, "rlrun_bench_followed"))
    service = ServiceProcess(db_url, ray_url, args.workdir / f"{uuid.uuid4().hex}.log")
    service.env["RLRUN_READ_CACHE_S"] = str(args.read_cache_s)
    service.env["RLRUN_FOLLOW_INTERVAL_S"] = "1"
    headers = secured(service, db_url, args.auth)
    stack.callback(service.stop)
    with httpx.Client(base_url=service.url, timeout=30, headers=headers) as http:
        ids = [http.post("/runs", json=FOLLOWED_SPEC).json()["id"] for _ in range(FOLLOWED)]
        for run_id in ids:
            stack.callback(
                lambda r=run_id: httpx.post(f"{service.url}/runs/{r}/cancel", headers=headers)
            )
        for run_id in ids:
            wait_for(
                lambda r=run_id: http.get(f"/runs/{r}").json(),
                lambda run: (run["progress"]["step"] or 0) >= 2,
                timeout=120,
                every=0.5,
            )
    return service.url, ids, headers


def ray_section(db: str) -> Callable[[ExitStack, argparse.Namespace], Section]:
    def make(stack: ExitStack, args: argparse.Namespace) -> Section:
        ray_url, job_ids, auth = ray_head(stack, args)
        url, run_ids, ours = service_on(
            stack,
            dict(args.db_urls)[db],
            args.workdir,
            args.read_cache_s,
            args.points_steps,
            args.auth,
        )
        followed_url, followed, ours_followed = followed_service(stack, db, args, ray_url)
        run_id, big_id = run_ids[0], run_ids[1]
        job_id = job_ids[0]
        # A pass of 100 distinct runs after the kept answers have lapsed: every read a miss.
        pause_s = args.read_cache_s + 0.2

        def get(name: str, path: str, ray_path: str) -> Row:
            """A row of one GET on the service and one on Ray's job API."""
            ray = Target(ray_url, "GET", ray_path, headers=auth)
            return Row(name, Target(url, "GET", path, headers=ours), ray)

        return Section(
            f"rlrun on {db} vs Ray's job API",
            "Ray",
            [
                get("no-op (the HTTP stack alone)", "/healthz", "/api/version"),
                get("read one run", f"/runs/{run_id}", f"/api/jobs/{job_id}"),
                Row(
                    f"read {FOLLOWED} followed runs (a metric line each second each)",
                    Target(followed_url, "GET", *_round(followed), headers=ours_followed),
                    Target(ray_url, "GET", *_round(followed, "/api/jobs/"), headers=auth),
                ),
                Row(
                    "read 100 distinct runs once each",
                    Target(url, "GET", *_round(run_ids), warm="/healthz", headers=ours),
                    Target(
                        ray_url,
                        "GET",
                        *_round(job_ids, "/api/jobs/"),
                        warm="/api/version",
                        headers=auth,
                    ),
                    passes=args.passes,
                    pause_s=pause_s,
                ),
                get(
                    f"read one run, {POINTS_KEYS * args.points_steps:,} points",
                    f"/runs/{big_id}",
                    f"/api/jobs/{job_id}",
                ),
                get("list 100", "/runs?limit=100", "/api/jobs/"),
                Row(
                    "accept a run",
                    Target(url, "POST", "/runs", RUN_SPEC, ok=201, headers=ours),
                    Target(ray_url, "POST", "/api/jobs/", RAY_JOB, headers=auth),
                    peer_keeps_working=True,
                ),
            ],
        )

    return make


def _round(ids: Sequence[str], prefix: str = "/runs/") -> tuple[str, None, int, tuple[str, ...]]:
    """``Target`` fields after the method for GETs that go round ``ids``."""
    paths = [f"{prefix}{i}" for i in ids]
    return paths[0], None, 200, tuple(paths[1:])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--clients", default="1,16,64")
    parser.add_argument("--db", default="sqlite,postgres")
    parser.add_argument("--read-cache-s", type=float, default=1.0)
    parser.add_argument("--passes", type=int, default=5, help="of 100 distinct runs")
    parser.add_argument("--rounds", type=int, default=1, help="each side in turn, per cell")
    parser.add_argument("--auth", action="store_true", help="the service checks a token too")
    parser.add_argument("--quick", action="store_true", help="every row, briefly (seconds)")
    parser.add_argument(
        "--rows", type=lambda v: v.split(","), default=[], help="words of the rows to measure"
    )
    parser.add_argument("--points-steps", type=int, default=POINTS_STEPS, help="x 100 keys")
    args = parser.parse_args()
    if args.quick:
        global RAY_JOBS
        args.seconds, args.clients, args.db, args.passes, args.rounds = 0.3, "16", "sqlite", 1, 2
        args.points_steps, RAY_JOBS = 100, 10
    with tempfile.TemporaryDirectory() as tmp, databases(Path(tmp)) as db_urls:
        args.workdir, args.db_urls = Path(tmp), db_urls
        run([ray_section(db) for db in args.db.split(",")], args)


if __name__ == "__main__":
    main()

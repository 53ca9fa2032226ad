"""Many run lifecycles through one replica in this process, on the fake Ray; what stays behind.

``soak(n)`` serves the real app (uvicorn in a thread, loops on) on ``FakeRay``, accepts ``n``
runs over HTTP in waves, lets each be submitted, run (printing metric lines), end and have its
log read to the end, with live event streams attaching to some runs (some read to the end, some
leave early), and measures this process's RSS, threads, file descriptors and sockets after a
warm-up wave and again after the last one.
"""

from __future__ import annotations

import gc
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI
from sqlalchemy import func, select

import service.cluster.registry
from service.app import create_app
from service.settings import Settings
from service.store.db import Database
from service.store.models import Run, RunLog
from tests.fake_ray import ENDED, FakeRay
from tests.live import ServerThread

DONE = ("SUCCEEDED", "FAILED", "STOPPED", "CANCELLED", "LOST")
# Waves before the first measure: pools and caches reach their working size.
WARM_UP = 2


@dataclass(frozen=True)
class Gauges:
    rss_mb: float
    threads: int  # other than the request threads' pool
    workers: int  # AnyIO's request threads: it keeps up to request_threads, idle ones 10 s
    fds: int  # other than the database's files (its connections are pooled, up to a bound)
    sockets: int
    db_fds: int

    @classmethod
    def now(cls, db_path: Path) -> Gauges:
        gc.collect()
        rss = 0.0
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024
        targets = []
        for fd in os.listdir("/proc/self/fd"):
            with suppress(OSError):
                targets.append(os.readlink(f"/proc/self/fd/{fd}"))
        db = [t for t in targets if t.startswith(str(db_path))]
        sockets = [t for t in targets if t.startswith("socket:")]
        threads = threading.enumerate()
        workers = sum(t.name == "AnyIO worker thread" for t in threads)
        return cls(
            rss, len(threads) - workers, workers, len(targets) - len(db), len(sockets), len(db)
        )


class Jobs:
    """The fake's jobs move on: a submitted job starts, prints ``steps`` metric lines (one per
    ``advance``), succeeds; jobs whose runs the service is done with are forgotten, as a Ray
    head with bounded job history would."""

    def __init__(self, ray: FakeRay, steps: int = 3) -> None:
        self.ray = ray
        self.steps = steps
        self._printed: dict[str, int] = {}

    def advance(self) -> None:
        for run_id, job in list(self.ray.jobs.items()):
            if job.status in ENDED:
                continue
            n = self._printed.get(run_id, 0)
            if n == self.steps:
                self.ray.set_status(run_id, "SUCCEEDED")
                continue
            if n == 0:
                self.ray.set_status(run_id, "RUNNING")
            self._printed[run_id] = n + 1
            line = (
                f"(TaskRunner pid=1) step:{n + 1} - critic/score/mean:0.{n} - actor/pg_loss:1.{n}\n"
            )
            self.ray.log[run_id] = self.ray.log.get(run_id, "") + line

    def forget(self, run_ids: set[str]) -> None:
        for run_id in run_ids:
            self.ray.jobs.pop(run_id, None)
            self.ray.log.pop(run_id, None)
            self._printed.pop(run_id, None)
        self.ray.submitted.clear()
        self.ray.stopped.clear()


@contextmanager
def replica(db_url: str, ray: FakeRay) -> Iterator[tuple[str, FastAPI]]:
    """The real app on ``ray`` (no Ray client of its own), served over HTTP; its base URL."""
    settings = Settings(
        database_url=db_url,
        ray_address="http://127.0.0.1:9",
        recipe_plugins="tests.recipes:register",
        auth="off",
        submit_interval_s=0.05,
        submit_batch=64,
        reconcile_interval_s=0.05,
        follow_interval_s=0.05,
        events_poll_s=0.2,
        watchdog_interval_s=1.0,
        read_cache_s=0.0,
    )
    real = service.cluster.registry.RayJobs
    service.cluster.registry.RayJobs = lambda *_a, **_k: ray  # type: ignore[assignment,misc]
    app = create_app(settings)
    try:
        with ServerThread(app) as url:
            yield url, app
    finally:
        service.cluster.registry.RayJobs = real  # type: ignore[misc]


def _stream(url: str, run_id: str, to_the_end: bool) -> int:
    """Attach to a run's live events; read to the ``end`` event or leave after the first."""
    events = 0
    timeout = httpx.Timeout(10, read=60)
    with httpx.stream("GET", f"{url}/runs/{run_id}/events", timeout=timeout) as resp:
        for line in resp.iter_lines():
            if line.startswith("event:"):
                events += 1
                if not to_the_end or line.endswith("end"):
                    break
    return events


def soak(
    n: int,
    tmp: Path,
    wave: int = 100,
    stream_every: int = 4,
    progress: Callable[[int, Gauges], None] | None = None,
) -> dict[str, Any]:
    """``n`` lifecycles after the warm-up waves; the gauges before and after, and the time."""
    db_path = tmp / "soak.db"
    db_url = f"sqlite:///{db_path}"
    ray = FakeRay({f"n{i}": {"NPU": 8.0, "CPU": 64.0} for i in range(4)})
    jobs = Jobs(ray)
    streams = ThreadPoolExecutor(8, thread_name_prefix="soak-stream")
    with replica(db_url, ray) as (url, app):
        db = Database(db_url)

        def one_wave(index: int) -> None:
            # A client per wave: its kept-alive connections close with the wave, so the
            # gauges between waves count the service's sockets, not a client pool's.
            with httpx.Client(base_url=url, timeout=30) as client:

                def accept(name: str) -> str:
                    resp = client.post("/runs", json={"recipe": "test-script", "name": name})
                    assert resp.status_code == 201, resp.text
                    run_id: str = resp.json()["id"]
                    return run_id

                ids = list(streams.map(lambda i: accept(f"w{index}-{i}"), range(wave)))
            watched = [
                streams.submit(_stream, url, run_id, k % 2 == 0)
                for k, run_id in enumerate(ids[::stream_every])
            ]
            deadline = time.monotonic() + 120
            while True:
                jobs.advance()
                with db.read() as s:
                    left = s.scalar(
                        select(func.count())
                        .select_from(Run)
                        .outerjoin(RunLog, RunLog.run_id == Run.id)
                        .where(Run.id.in_(ids))
                        .where(~Run.status.in_(DONE) | RunLog.finished_at.is_(None))
                    )
                if not left:
                    break
                assert time.monotonic() < deadline, f"{left} runs of wave {index} not done"
                time.sleep(0.05)
            for future in watched:
                future.result(timeout=60)
            jobs.forget(set(ids))

        for index in range(WARM_UP):
            one_wave(index)
        time.sleep(1.0)
        before = Gauges.now(db_path)
        started = time.monotonic()
        for index in range(WARM_UP, WARM_UP + -(-n // wave)):
            one_wave(index)
            if progress is not None:
                progress(index - WARM_UP + 1, Gauges.now(db_path))
        elapsed = time.monotonic() - started
        after = _settled(db_path, before)
        with httpx.Client(base_url=url, timeout=30) as client:
            held = _service_gauges(client) | {"sqlite_cache_mb": _sqlite_cache_mb(app)}
        with db.read() as s:
            done = s.scalar(select(func.count()).select_from(Run).where(Run.status.in_(DONE)))
        db.dispose()
    streams.shutdown()
    return {"before": before, "after": after, "seconds": elapsed, "runs_done": done} | held


def _settled(db_path: Path, before: Gauges, within_s: float = 20.0) -> Gauges:
    """The gauges once the last streams' server side has wound down: at most ``within_s``
    for descriptors and sockets to come back to ``before`` (what stays past that is held)."""
    deadline = time.monotonic() + within_s
    while True:
        now = Gauges.now(db_path)
        settled = now.fds <= before.fds and now.sockets <= before.sockets
        if settled or time.monotonic() > deadline:
            return now
        time.sleep(0.5)


def _sqlite_cache_mb(app: FastAPI) -> float:
    """The most SQLite's page caches of the replica's open connections may hold: memory that
    fills as the database grows, up to this bound (``PRAGMA cache_size`` per connection)."""
    engine = app.state.services.db.engine
    pool = engine.pool
    with engine.connect() as conn:
        size = conn.exec_driver_sql("PRAGMA cache_size").scalar_one()
        page = conn.exec_driver_sql("PRAGMA page_size").scalar_one()
    per_connection = -size * 1024 if size < 0 else size * page
    connections = pool.checkedin() + pool.checkedout()  # type: ignore[attr-defined]
    return float(connections * per_connection / 2**20)


def _service_gauges(client: httpx.Client) -> dict[str, float]:
    """What the replica still holds per run, from its /metrics: live stream upstreams and
    followed runs (both 0 once every run has ended and every client has left)."""
    wanted = {"rlrun_event_streams": "upstreams", "rlrun_followed_runs": "followed"}
    out = {}
    for line in client.get("/metrics").text.splitlines():
        name, _, value = line.partition(" ")
        if name in wanted:
            out[wanted[name]] = float(value)
    return out

"""Under load the service never hangs: bounded waits, 503 with Retry-After, prompt SIGTERM.

The fast tests run the app with four worker threads, so that a lock held from one worker
thread into the next (the old deadlock) would hang them at once. The slow suite drives the real
service (a child process, loops running, Ray unreachable) with 500 concurrent clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import anyio.to_thread
import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, select, text

from service.app import create_app
from service.metrics.broker import Broker, Cursor
from service.store.db import Database, upgrade
from service.store.models import Run
from service.store.status import RunStatus
from tests.conftest import make_settings, served
from tests.factories import add_run
from tests.live import ServerThread
from tests.loadgen import SPEC, HealthProbe, Tally, flood, loop_ticks, quantile
from tests.service_process import ServiceProcess


@pytest.fixture
def small_server(db_url: str) -> Iterator[str]:
    """The app (no loops, Ray unreachable) served with 4 worker threads instead of 40."""
    app = create_app(make_settings(db_url, "http://127.0.0.1:9", run_loops=False, db_wait_s=1))
    server = ServerThread(app)
    with server as url:

        async def shrink() -> None:
            anyio.to_thread.current_default_thread_limiter().total_tokens = 4

        loop = server.server.servers[0].get_loop()
        asyncio.run_coroutine_threadsafe(shrink(), loop).result(10)
        yield url


def test_a_hundred_concurrent_requests_on_four_threads_all_answer(small_server: str) -> None:
    async def burst() -> Counter[int]:
        limits = httpx.Limits(max_connections=200)
        async with httpx.AsyncClient(base_url=small_server, timeout=20, limits=limits) as http:
            run_id = (await http.post("/runs", json=SPEC)).json()["id"]
            calls = [http.get("/runs", params={"limit": 5}) for _ in range(40)]
            calls += [http.get(f"/runs/{run_id}") for _ in range(40)]
            calls += [http.post("/runs", json=SPEC) for _ in range(20)]
            answers = await asyncio.gather(*calls)
            assert (await http.get("/healthz")).status_code == 200
            return Counter(r.status_code for r in answers)

    started = time.monotonic()
    statuses = asyncio.run(asyncio.wait_for(burst(), 30))
    assert statuses == {200: 80, 201: 20}
    assert time.monotonic() - started < 30


def test_a_write_that_cannot_get_the_database_is_a_503_with_retry_after_while_reads_go_on(
    db_url: str,
) -> None:
    app = create_app(make_settings(db_url, "http://127.0.0.1:9", run_loops=False, db_wait_s=0.3))
    with ServerThread(app) as url, httpx.Client(base_url=url, timeout=10) as http:
        run_id = http.post("/runs", json=SPEC).json()["id"]
        with _hold_write_lock(db_url, run_id):
            started = time.monotonic()
            busy = http.post(f"/runs/{run_id}/cancel")
            waited = time.monotonic() - started
            read = http.get(f"/runs/{run_id}")
        assert busy.status_code == 503, busy.text
        assert busy.headers["retry-after"] == "1"
        assert busy.headers["content-type"] == "application/problem+json"
        assert 0.25 < waited < 3
        assert read.status_code == 200 and read.json()["status"] == "QUEUED"
        assert http.post(f"/runs/{run_id}/cancel").json()["status"] == "CANCELLED"


def test_past_the_limit_a_request_is_refused_at_once_and_healthz_still_answers(
    db_url: str,
) -> None:
    limit = {"db_wait_s": 5, "max_requests_in_progress": 2}
    with served(db_url, **limit) as url, httpx.Client(base_url=url, timeout=10) as http:
        run_id = http.post("/runs", json=SPEC).json()["id"]
        # Two cancels wait for the database: the limit is reached.
        refused, took, health, answered = _read_while_two_cancels_wait(http, url, db_url, run_id)
    assert refused.status_code == 503, refused.text
    assert refused.headers["retry-after"] == "1"
    assert refused.json()["title"] == "Service busy"
    assert took < 0.5
    assert health.status_code == 200
    assert answered == [200, 409]


def test_a_request_not_started_within_the_wait_is_a_503_and_live_streams_hold_no_place(
    db_url: str,
) -> None:
    # One worker thread: two requests are in at a time, the others wait at the door.
    one_thread = {"db_wait_s": 5, "request_threads": 1, "max_request_wait_s": 0.5}
    with served(db_url, **one_thread) as url, httpx.Client(base_url=url, timeout=10) as http:
        run_id = http.post("/runs", json=SPEC).json()["id"]
        # Three live streams, more than the two places inside: their headers are out, so
        # they hold none.
        with contextlib.ExitStack() as streams:
            for _ in range(3):
                stream = streams.enter_context(http.stream("GET", f"/runs/{run_id}/events"))
                assert stream.status_code == 200
            assert http.get(f"/runs/{run_id}").status_code == 200
        # Two cancels wait for the database, inside: the places are taken.
        late, waited, health, answered = _read_while_two_cancels_wait(http, url, db_url, run_id)
    assert late.status_code == 503, late.text
    assert late.headers["retry-after"] == "1"
    assert "not started within 0.5 s" in late.json()["detail"]
    assert 0.4 < waited < 2
    assert health.status_code == 200
    assert answered == [200, 409]


def _read_while_two_cancels_wait(
    http: httpx.Client, url: str, db_url: str, run_id: str
) -> tuple[httpx.Response, float, httpx.Response, list[int]]:
    """``GET`` the run, then ``/healthz``, while two cancels of it wait on another writer's
    lock: the read's answer and how long it took, healthz's answer, and the cancels' statuses
    (sorted) once the lock is let go."""
    with _two_cancels_waiting(url, db_url, run_id) as answered:
        started = time.monotonic()
        read = http.get(f"/runs/{run_id}")
        took = time.monotonic() - started
        health = http.get("/healthz")
    return read, took, health, answered


@contextmanager
def _two_cancels_waiting(url: str, db_url: str, run_id: str) -> Iterator[list[int]]:
    """Two cancels of ``run_id`` sent and waiting (a second) on another writer's lock; once
    the lock is let go, the list holds their statuses, sorted."""
    answered: list[int] = []
    with ThreadPoolExecutor(2) as pool:
        with _hold_write_lock(db_url, run_id):
            cancels = [
                pool.submit(httpx.post, f"{url}/runs/{run_id}/cancel", timeout=10) for _ in range(2)
            ]
            time.sleep(1)
            yield answered
        answered.extend(sorted(c.result().status_code for c in cancels))


@contextmanager
def _hold_write_lock(db_url: str, run_id: str) -> Iterator[None]:
    """Another process's writer: SQLite's write lock, or a PostgreSQL row lock on the run."""
    engine = create_engine(db_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        else:
            conn.exec_driver_sql("BEGIN")
            conn.execute(text("SELECT id FROM runs WHERE id = :id FOR UPDATE"), {"id": run_id})
        try:
            yield
        finally:
            conn.exec_driver_sql("ROLLBACK")
    engine.dispose()


# --- the load suite ------------------------------------------------------------------------

CLIENTS = 500
# Per database (CI time): 30 s on SQLite, 30 s on PostgreSQL.
LOAD_S = 30.0
# RLRUN_SHUTDOWN_GRACE_S for the service under test; SIGTERM must stop it within it.
GRACE_S = 5.0
# The slowest /healthz on the probe listener, polled from its own process throughout (the
# figure itself, p99, is tests/benchmarks/bench_probes.py's).
HEALTH_BOUND_S = 1.0


@pytest.mark.slow
def test_500_clients_get_bounded_answers_lose_no_run_and_sigterm_stops_it(
    db_url: str, tmp_path: Path
) -> None:
    service = ServiceProcess(db_url, "http://127.0.0.1:9", tmp_path / "service.log")
    service.env |= {
        "RLRUN_SHUTDOWN_GRACE_S": str(GRACE_S),
        "RLRUN_WATCHDOG_INTERVAL_S": "1",
        "RLRUN_FOLLOW_INTERVAL_S": "1",
    }
    tally = Tally()
    service.start()
    try:
        ticks_before = loop_ticks(service.url)
        probe = HealthProbe(time.time() + LOAD_S - 1, service.probe_url, service.url)
        ticks_during: dict[str, float] = {}

        async def sigterm() -> float:
            assert service.proc is not None
            signalled = time.monotonic()
            service.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                await asyncio.to_thread(service.proc.wait, GRACE_S + 10)
            return time.monotonic() - signalled

        async def load_and_count_ticks() -> float:
            async def ticks_half_way() -> None:
                # Half way, so that retries after a shed 503 still end before the SIGTERM.
                await asyncio.sleep(LOAD_S / 2)
                ticks_during.update(await asyncio.to_thread(loop_ticks, service.url))

            counting = asyncio.create_task(ticks_half_way())
            stop_s = await flood(service.url, tally, CLIENTS, LOAD_S, at_end=sigterm)
            await counting
            return stop_s

        stop_s = asyncio.run(load_and_count_ticks())
        probed = probe.result()
        health, api_health = probed[service.probe_url], probed[service.url]
    finally:
        service.stop()

    db = Database(db_url)
    with db.read() as session:
        stored = set(session.scalars(select(Run.id).where(Run.id.in_(tally.accepted))))
    db.dispose()
    lost = tally.accepted - stored
    lat = sorted(tally.latencies)
    busy = sum(n for (_, status), n in tally.statuses.items() if status in (429, 503))
    print(
        f"\n{db_url.split(':')[0]}: {len(lat)} answers in {LOAD_S:.0f} s with {CLIENTS} clients, "
        f"p50 {quantile(lat, 0.5) * 1000:.0f} ms, p99 {quantile(lat, 0.99) * 1000:.0f} ms, "
        f"max {lat[-1]:.2f} s; 503/429: {busy}; runs accepted {len(tally.accepted)}, lost "
        f"{len(lost)}; /healthz on the probe port p99 "
        f"{quantile(health['latencies'], 0.99) * 1000:.0f} ms, "
        f"max {max(health['latencies']) * 1000:.0f} ms; on the API's port p99 "
        f"{quantile(api_health['latencies'], 0.99) * 1000:.0f} ms; "
        f"stopped {stop_s:.1f} s after SIGTERM; loop ticks {ticks_before} -> {ticks_during}; "
        f"{dict(sorted(tally.statuses.items()))}; p99 per action (ms) "
        f"{ {a: round(quantile(ts, 0.99) * 1000) for a, ts in sorted(tally.by_action.items())} }"
    )
    assert not tally.bad, tally.bad[:20]
    assert not lost
    assert len(tally.accepted) > 100
    assert len(lat) > 3 * CLIENTS
    assert not health["failures"], health["failures"][:5]
    assert max(health["latencies"]) < HEALTH_BOUND_S
    assert stop_s < GRACE_S + 2
    # The loops kept ticking under load (the watchdog every second).
    assert ticks_during["watchdog"] - ticks_before["watchdog"] >= (LOAD_S / 2) / 3


@pytest.mark.postgres
def test_a_connection_postgresql_dropped_is_one_503_then_the_pool_is_renewed(
    pg_database: str,
) -> None:
    settings = make_settings(pg_database, "http://127.0.0.1:9", run_loops=False, read_cache_s=0)
    app = create_app(settings)
    with TestClient(app) as api:
        run_id = api.post("/runs", json=SPEC).json()["id"]
        # Both pools hold a connection: the writes' (threads) and the run reads' (the loop's).
        assert api.get(f"/runs/{run_id}").status_code == 200
        admin = create_engine(pg_database, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            )
        admin.dispose()
        for send in (lambda: api.get(f"/runs/{run_id}"), lambda: api.post("/runs", json=SPEC)):
            dropped = send()
            assert dropped.status_code == 503 and dropped.headers["retry-after"] == "1"
            assert send().status_code in (200, 201)


def test_at_shutdown_a_live_stream_ends_at_once_without_an_end_event(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/broker.db"
    upgrade(url)
    db = Database(url)
    run_id = add_run(db, "queued", RunStatus.QUEUED)  # never ends by itself
    broker = Broker(db, poll_s=0.05)

    async def follow() -> list[str]:
        kinds = []
        async for item, _cursor in broker.subscribe(run_id, Cursor()):
            kinds.append(item.kind)
        return kinds

    async def main() -> tuple[list[str], float, list[str]]:
        stream = asyncio.create_task(follow())
        await asyncio.sleep(0.5)
        started = time.monotonic()
        broker.close_streams()
        kinds = await asyncio.wait_for(stream, 5)
        took = time.monotonic() - started
        later = [item.kind async for item, _ in broker.subscribe(run_id, Cursor())]
        await broker.close()
        return kinds, took, later

    kinds, took, later = asyncio.run(main())
    db.dispose()
    assert "end" not in kinds and took < 1
    assert later == []

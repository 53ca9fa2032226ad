"""PostgreSQL's reads on the event loop (``service.store.loop_reads``): psycopg's pool, bounded
by its size and the database's wait, one pool per loop, closed on the loop that opened it, a few
connections made when a served app starts."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from service.app import create_app
from service.errors import DatabaseBusy
from service.store import runs
from service.store.db import LOOP_KEPT, Database
from tests.conftest import _truncate, make_settings, wait_for
from tests.factories import add_run

pytestmark = pytest.mark.postgres


@pytest.fixture
def pg(pg_database: str) -> Iterator[Database]:
    _truncate(pg_database)
    # A generous wait: on a busy machine making a connection can take more than a second.
    database = Database(pg_database, pool_size=2)
    add_run(database, "r1")
    yield database
    database.dispose()


def _ours(db: Database) -> int:
    """Connections to this database other than the asking one's."""
    with db.engine.connect() as conn:
        return int(
            conn.scalar(
                text(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            )
            or 0
        )


def test_reads_on_a_loop_use_at_most_the_pool_and_a_read_past_it_is_busy_in_time(
    pg_database: str, pg: Database
) -> None:
    params = {"run_id": "r1"}
    # The fixture's run, on a database whose reads wait 0.3 s for a connection.
    short = Database(pg_database, wait_s=0.3, pool_size=2)
    before = _ours(short)

    async def reads() -> None:
        try:
            # Both connections made first: on a busy machine making one can take longer than
            # the 0.3 s a read waits for one.
            await short._loop_reads._current(2).open(wait=True, timeout=60)  # type: ignore[union-attr]
            # Twice the pool's size at once: they share its two connections.
            got = await asyncio.gather(*(short.rows(runs._PAGE_RUN, params) for _ in range(4)))
            assert [r[0].id for r in got] == ["r1"] * 4
            assert _ours(short) - before <= 2
            # Both connections held (each by a statement sleeping on the server): the next read
            # waits its wait_s, then it is a 503 to retry, not a wait without end.
            async with asyncio.timeout(5):
                held = [asyncio.ensure_future(_sleep_on(short)) for _ in range(2)]
                await asyncio.sleep(0.2)
                started = asyncio.get_running_loop().time()
                with pytest.raises(DatabaseBusy, match=r"no database connection within 0\.3 s"):
                    await short.rows(runs._PAGE_RUN, params)
                assert asyncio.get_running_loop().time() - started < 2
                await asyncio.gather(*held)
        finally:
            # Closed on this loop whatever happened: a pool left open keeps the loop from
            # closing while its workers still try to connect.
            await short.dispose_async()

    try:
        asyncio.run(reads())
        # Closed on the loop that opened them: the server's backends end a moment after the
        # client hangs up (longer on a loaded host), a pool left open never.
        wait_for(lambda: _ours(short) == before, bool, timeout=10)
    finally:
        short.dispose()


async def _sleep_on(db: Database) -> None:
    """Hold one of the loop's connections for a second."""
    pool = db._loop_reads._current()  # type: ignore[union-attr]
    async with pool.connection() as conn:
        await conn.execute("SELECT pg_sleep(1)")


def test_each_loop_reads_on_its_own_connections_and_leaves_no_task_behind(
    pg: Database, caplog: pytest.LogCaptureFixture
) -> None:
    gc.collect()  # what earlier tests left (another library's server tasks) is theirs
    caplog.clear()
    params = {"run_id": "r1"}
    first = asyncio.run(pg.rows(runs._PAGE_RUN, params))  # that loop is closed after it
    second = asyncio.run(pg.rows(runs._PAGE_RUN, params))  # a new pool on the new loop
    assert first == second and first[0].id == "r1"

    async def close() -> None:
        await pg.dispose_async()

    asyncio.run(close())  # another loop's pool: left, not awaited on a loop that is gone
    gc.collect()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_served_app_makes_a_few_loop_connections_at_start_and_closes_them_at_shutdown(
    pg: Database,
) -> None:
    before = _ours(pg)
    settings = make_settings(pg.url, "http://127.0.0.1:9", run_loops=False)
    with TestClient(create_app(settings)) as client:
        # Made in the background at start, before any read asks for one.
        wait_for(lambda: _ours(pg) - before >= LOOP_KEPT, bool, timeout=10)
        assert client.get("/runs/r1").json()["id"] == "r1"
    # The app's other pooled connections close with it too: none of the app's is left.
    wait_for(lambda: _ours(pg) == before, bool, timeout=10)

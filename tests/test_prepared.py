"""The hot reads on the driver's cursor (``service/store/prepared.py``) give exactly the rows
SQLAlchemy's own execution gives, on both databases, values of every column type included (UTC
datetimes, JSON documents, NaN and infinite metric values, NULLs), and statement listeners see
them; a connection the server
dropped is a ``DatabaseBusy`` to retry, and the next read gets a new one."""

from __future__ import annotations

import asyncio
import logging
import math
import sqlite3
import time
from typing import Any

import pytest
from sqlalchemy import text

from service.errors import DatabaseBusy
from service.metrics import store
from service.metrics.parse import MetricLine
from service.store import lifecycle, runs, tokens
from service.store.db import Database
from service.store.models import Run
from service.store.prepared import Prepared, fetch
from service.store.status import RunStatus
from tests.factories import new_run, statements


def _same(a: Any, b: Any) -> None:
    """Rows equal field by field, NaN equal to NaN, and with the same field names."""
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x._fields == tuple(y._fields)
        for u, v in zip(x, y, strict=True):
            assert type(u) is type(v), (u, v)
            assert u == v or (isinstance(u, float) and math.isnan(u) and math.isnan(v)), (u, v)


@pytest.fixture
def stored(db: Database) -> dict[str, str]:
    """A run that started (three events), with metric values finite, NaN and infinite, and a
    token; and a run with no events beyond its acceptance and no metrics."""
    with db.transaction() as s:
        run = new_run("r1", RunStatus.QUEUED, spec={"recipe": "x", "lr": 1e-6, "n": None})
        bare = new_run("r2", RunStatus.QUEUED)
        lifecycle.accept(s, [run])  # the run stays out of the session
        s.add(bare)
        run = runs.load_run(s, "r1")
        lifecycle.transition(s, run, RunStatus.SUBMITTED, "submitted")
        lifecycle.transition(s, run, RunStatus.RUNNING, "running")
        run.health_reason = "ünïcode \u2603"
        values = {"critic/score/mean": 0.25, "critic/rewards/mean": math.nan}
        values["critic/score/max"] = math.inf
        store.add_lines(s, run.id, [(i, MetricLine(i, values)) for i in range(3)])
        _row, secret = tokens.create(s, "ann", "red", "member")
        return {"run": run.id, "bare": bare.id, "digest": tokens.digest(secret)}


READS = [
    (runs._PAGE_RUN, "run_id"),
    (runs._PAGE_EVENTS, "run_id"),
    (runs._PAGE_LATEST, "run_id"),
    (tokens._ACTIVE, "token_hash"),
]


def test_the_rows_are_sqlalchemys_own(db: Database, stored: dict[str, str]) -> None:
    cases: list[tuple[Prepared, dict[str, Any]]] = []
    for prepared, name in READS:
        values = [stored["digest"], "nope"] if name == "token_hash" else [stored["run"]]
        values += [stored["bare"]] if name == "run_id" else []
        cases += [(prepared, {name: v}) for v in values]
    if db.engine.dialect.name == "postgresql":
        both = [stored["run"], stored["bare"]]
        cases += [(runs._PAGES_AT_ONCE, {"run_ids": ids}) for ids in ([stored["run"]], both)]
    with db.read_rows() as conn:
        for prepared, params in cases:
            theirs = conn.execute(prepared.statement, params).all()
            ours = fetch(conn, prepared, params)
            _same(ours, theirs)
        # Something to compare: the run with its events, metrics and unusual values.
        assert len(fetch(conn, runs._PAGE_EVENTS, {"run_id": stored["run"]})) == 3
        latest = fetch(conn, runs._PAGE_LATEST, {"run_id": stored["run"]})
        assert {k for k, _s, _v in latest} >= {"critic/score/mean", "critic/score/max"}
    # Awaited on the loop (PostgreSQL's async driver; SQLite's loop connection), and seen by
    # the engines' statement listeners as any statement is.
    with statements(db, "SELECT") as seen:
        awaited = asyncio.run(db.rows(runs._PAGE_RUN, {"run_id": stored["run"]}))
    assert runs._PAGE_RUN.compiled(db.engine.dialect).sql in seen
    with db.read_rows() as conn:
        _same(awaited, conn.execute(runs._RUN, {"run_id": stored["run"]}).all())
    assert awaited[0].health_reason == "ünïcode \u2603" and awaited[0].created_at.tzinfo


def test_a_run_page_read_on_the_cursor_is_the_page(db: Database, stored: dict[str, str]) -> None:
    row, events, latest = asyncio.run(runs.run_page(db, stored["run"]))
    with db.read() as s:
        run = s.get(Run, stored["run"])
        assert run is not None and row.status == run.status == "RUNNING"
        assert row.spec == run.spec and row.launch == run.launch
        assert row.created_at == run.created_at
    assert [e.to_status for e in events] == ["QUEUED", "SUBMITTED", "RUNNING"]
    assert latest["critic/score/mean"] == (2, 0.25) and latest["critic/score/max"] == (2, math.inf)
    assert math.isnan(latest["critic/rewards/mean"][1])


def test_a_dropped_connection_is_busy_once_then_renewed(
    db: Database, stored: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    if db.engine.dialect.name != "postgresql":
        pytest.skip("a server that drops connections: PostgreSQL")
    params = {"run_id": stored["run"]}

    async def reads() -> list[Any]:
        try:
            first = await db.rows(runs._PAGE_RUN, params)  # a pooled connection of the loop's
            with db.engine.connect() as admin:
                admin.execute(
                    text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    )
                )
            with pytest.raises(DatabaseBusy, match="lost"):
                for _ in range(16):  # the first is refused, and has the pool's others checked
                    await db.rows(runs._PAGE_RUN, params)
            return [first, await db.rows(runs._PAGE_RUN, params)]
        finally:
            # As the app does at shutdown: the pool's own tasks (its check's reconnections) are
            # ended by closing it, not left for asyncio.run to cancel.
            await db.dispose_async()

    first, again = asyncio.run(reads())
    assert first[0].id == again[0].id == stored["run"]
    # The lost connection was closed and dropped by the pool (a warning), never handed out again
    # to fail there: no error logged.
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_loop_read_of_a_locked_sqlite_file_is_busy_in_time_then_served(
    db: Database, stored: dict[str, str]
) -> None:
    if db.engine.dialect.name != "sqlite":
        pytest.skip("a database file another process locks: SQLite")
    params = {"run_id": stored["run"]}
    # Another connection takes the file for itself once this process's connections are closed:
    # the loop's next read cannot even open its connection.
    db.dispose()
    locker = sqlite3.connect(db.engine.url.database or "", isolation_level=None, timeout=5)
    locker.execute("PRAGMA locking_mode=EXCLUSIVE")
    locker.execute("BEGIN EXCLUSIVE")
    try:
        started = time.monotonic()
        with pytest.raises(DatabaseBusy, match="locked"):
            asyncio.run(db.rows(runs._PAGE_RUN, params))
        assert time.monotonic() - started < 2
    finally:
        locker.execute("ROLLBACK")
        locker.close()
    assert asyncio.run(db.rows(runs._PAGE_RUN, params))[0].id == stored["run"]

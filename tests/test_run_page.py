"""What ``GET /runs/{id}`` reads (one statement on PostgreSQL, three queries on SQLite) is what
the run's rows say, read one by one: its columns, its events in order, its latest values with
NaN and infinities, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from service.errors import NotFound
from service.metrics import store
from service.metrics.parse import MetricLine
from service.operations.run_docs import run_doc
from service.store.db import Database
from service.store.lifecycle import note
from service.store.models import Run
from service.store.runs import events_of, run_page, run_row
from service.wire.documents import encode
from tests.factories import add_run, statements


def _one_by_one(db: Database, run_id: str) -> bytes:
    with db.read() as s:
        row = run_row(s, run_id)
        return encode(run_doc(row, events_of(s, run_id), store.latest(s, run_id)))


def _read(db: Database, run_id: str) -> tuple[Any, ...]:
    async def read() -> tuple[Any, ...]:
        try:
            return await run_page(db, run_id)
        finally:
            await db.dispose_async()  # its connections are this loop's

    return asyncio.run(read())


def _page(db: Database, run_id: str) -> bytes:
    return encode(run_doc(*_read(db, run_id)))


def test_a_runs_page_is_its_rows(db: Database) -> None:
    add_run(db, "bare")  # no event, no metric
    assert _page(db, "bare") == _one_by_one(db, "bare")
    add_run(db, "r1")
    values = {"critic/score/mean": 0.1 + 0.2, "critic/score/max": math.inf}
    values |= {"critic/score/min": -math.inf, "training/global_step": math.nan}
    with db.transaction() as s:
        store.add_lines(s, "r1", [(10, MetricLine(1, {"critic/score/mean": 1 / 3}))])
        store.add_lines(s, "r1", [(20, MetricLine(2, values))])
        store.add_lines(s, "r1", [(30, MetricLine(3, {"val-core/x/acc/mean@1": 2 / 3}))])
        run = s.get(Run, "r1")
        assert run is not None
        for reason in ("first", "second", "third"):
            note(s, run, reason)
    page = _page(db, "r1")
    assert page == _one_by_one(db, "r1")
    assert b'"critic/score/max":"Infinity"' in page and b"0.30000000000000004" in page
    assert page.index(b'"first"') < page.index(b'"second"') < page.index(b'"third"')
    with pytest.raises(NotFound):
        _read(db, "missing")


def _crowd(db: Database, run_ids: list[str]) -> tuple[list[Any], int]:
    """Each of ``run_ids`` read at once on one loop: the pages (or errors), and the statements."""

    async def read() -> list[Any]:
        try:
            return await asyncio.gather(*(run_page(db, r) for r in run_ids), return_exceptions=True)
        finally:
            await db.dispose_async()

    with statements(db, "SELECT") as seen:
        pages = asyncio.run(read())
    return pages, len(seen)


# Merging reads is PostgreSQL's (on SQLite a read is no round trip).
@pytest.mark.parametrize(
    "db_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
def test_pages_read_at_once_are_merged_and_each_its_own(db: Database) -> None:
    for i in range(40):
        add_run(db, f"r{i:02d}")
        with db.transaction() as s:
            store.add_lines(s, f"r{i:02d}", [(i, MetricLine(i, {"critic/score/mean": i / 7}))])
            run = s.get(Run, f"r{i:02d}")
            assert run is not None
            note(s, run, f"note {i}")
    # Ids that match no run: one with a NUL character (which PostgreSQL refuses to compare),
    # one that a cast to the column's VARCHAR(40) would cut to an existing id; one asked twice.
    add_run(db, "x" * 40)
    runs = [f"r{i:02d}" for i in range(40)]
    asked = [*runs, "a\x00b", "missing", "x" * 41, "r00"]
    pages, statements_run = _crowd(db, asked)
    assert statements_run < len(asked) / 2  # merged: not a statement per read
    for run_id, page in zip(asked, pages, strict=True):
        if run_id in runs:
            assert encode(run_doc(*page)) == _one_by_one(db, run_id), run_id
        else:
            assert isinstance(page, NotFound), run_id
    with pytest.raises(NotFound):  # read alone
        _read(db, "x" * 41)

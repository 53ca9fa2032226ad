"""Reads of runs that several routes share: a constant number of queries each."""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any, NamedTuple, TypeAlias

from sqlalchemy import Row, Select, String, any_, bindparam, func, select
from sqlalchemy.dialects.postgresql import ARRAY, aggregate_order_by
from sqlalchemy.orm import Session

from service.errors import NotFound
from service.store import attempts
from service.store.db import Database
from service.store.latest import LATEST_OF_RUN, latest_of
from service.store.models import MetricKey, Run, RunEvent
from service.store.prepared import Prepared, fetch
from service.wire.documents import stored_fields
from service.wire.runs import RunOut, RunSummary

AnyRow: TypeAlias = Row[*tuple[Any, ...]]

# What a run's page shows (``operations.run_docs.run_doc``), without the claim and idempotency
# columns: the fields its models mark stored (``wire.documents.STORED``), copied as they are,
# then the columns the builders read to make the others.
_SUMMARY_STORED = stored_fields(RunSummary)
SUMMARY_COLUMNS = (
    *(getattr(Run, name) for name in _SUMMARY_STORED),
    Run.priority,
    Run.health,
    Run.health_reason,
    Run.queue_reason,
    # A summary shows progress against the planned total, kept in the launch.
    Run.launch["total_steps"].as_integer().label("total_steps"),
    Run.launch["progress_key"].as_string().label("progress_key"),
)
RUN_COLUMNS = (
    *SUMMARY_COLUMNS,
    *(getattr(Run, name) for name in stored_fields(RunOut) if name not in _SUMMARY_STORED),
    Run.spec,
    Run.launch,
    Run.ray_status,
    Run.ray_message,
    Run.ray_error_type,
    Run.ray_exit_code,
    Run.stop_requested_at,
    Run.attempt,
    Run.attempt_status,
    Run.resumed_from_step,
    Run.budget_wait,
    Run.checkpoint_step,
    Run.checkpoint_at,
    Run.yield_by,
    Run.yield_then,
    Run.yield_reason,
    Run.stop_saved_step,
    Run.stop_lost_steps,
    Run.startup,
    Run.queued_why,
    Run.weight_syncs,
)
EVENT_COLUMNS = (
    RunEvent.id,
    RunEvent.at,
    RunEvent.from_status,
    RunEvent.to_status,
    RunEvent.reason,
    RunEvent.attempt,
    RunEvent.kind,
    RunEvent.step,
)


def load_run(session: Session, run_id: str, lock: bool = False) -> Run:
    run = session.get(Run, run_id, with_for_update=lock)
    if run is None:
        raise NotFound(f"no run {run_id!r}")
    return run


# Built once, run on the session's connection: the hot reads only bind their parameters and
# skip the ORM's result handling (building a statement costs more than running it on SQLite).
_RUN = select(*RUN_COLUMNS).where(Run.id == bindparam("run_id"))
_TEAM = select(Run.team).where(Run.id == bindparam("run_id"))
_EVENTS = select(*EVENT_COLUMNS).where(RunEvent.run_id == bindparam("run_id")).order_by(RunEvent.id)


def run_row(session: Session, run_id: str) -> AnyRow:
    """The columns of one run that its page shows (one query, no ORM object)."""
    row = session.connection().execute(_RUN, {"run_id": run_id}).one_or_none()
    if row is None:
        raise NotFound(f"no run {run_id!r}")
    return row


def team_of(session: Session, run_id: str) -> str:
    """The run's team (one small query); NotFound if there is no such run."""
    team: str | None = session.connection().scalar(_TEAM, {"run_id": run_id})
    if team is None:
        raise NotFound(f"no run {run_id!r}")
    return team


def events_of(session: Session, run_id: str) -> Sequence[AnyRow]:
    return session.connection().execute(_EVENTS, {"run_id": run_id}).all()


class EventRow(NamedTuple):
    id: int
    at: datetime
    from_status: str | None
    to_status: str
    reason: str
    attempt: int | None
    kind: str | None = None
    step: int | None = None


Latest = dict[str, tuple[int, float]]


async def run_page(db: Database, run_id: str) -> tuple[Any, Sequence[Any], Latest]:
    """What ``GET /runs/{id}`` shows: the run's row, its events and its latest metric values.
    On PostgreSQL one statement outside a transaction (one round trip, not five), awaited on the
    event loop, and merged with the other runs' pages asked meanwhile (``Database.row_of``); on
    SQLite, where a statement costs no round trip, the three queries in one read transaction
    (``Database.run_read``)."""
    if db.engine.dialect.name != "postgresql":
        return await db.run_read(lambda: _run_page_sqlite(db, run_id))
    # (No id holds a NUL, which PostgreSQL refuses to compare: no statement for it.)
    row = None if "\x00" in run_id else await db.row_of(_PAGES_AT_ONCE, "run_ids", run_id)
    if row is None:
        raise NotFound(f"no run {run_id!r}")
    # json_build_array gives timestamps as ISO text, non-finite numbers as text, NaN as null.
    events = [
        EventRow(id_, datetime.fromisoformat(at).astimezone(UTC), src, dst, reason, n, kind, step)
        for id_, at, src, dst, reason, n, kind, step in row.events_json or ()
    ]
    latest = {key: (step, _value(v)) for key, step, v in row.latest_json or ()}
    return row, events, latest


def _run_page_sqlite(db: Database, run_id: str) -> tuple[Any, Sequence[Any], Latest]:
    params = {"run_id": run_id}
    with db.read_rows() as conn:
        found = fetch(conn, _PAGE_RUN, params)
        if not found:
            raise NotFound(f"no run {run_id!r}")
        values = {key: (step, _value(v)) for key, step, v in fetch(conn, _PAGE_LATEST, params)}
        return found[0], fetch(conn, _PAGE_EVENTS, params), values


def _value(value: float | str | None) -> float:
    return math.nan if value is None else float(value)


def _at_once() -> Select[Any]:
    """The pages of the runs ``run_ids`` (a list), a row each: the run's columns, its events and
    its latest values as JSON arrays (PostgreSQL)."""
    events = (
        select(
            func.json_agg(aggregate_order_by(func.json_build_array(*EVENT_COLUMNS), RunEvent.id))
        )
        .where(RunEvent.run_id == Run.id)
        .scalar_subquery()
    )
    latest = (
        select(func.json_agg(func.json_build_array(MetricKey.key, MetricKey.step, MetricKey.value)))
        .where(latest_of(Run.id))
        .scalar_subquery()
    )
    return select(*RUN_COLUMNS, events.label("events_json"), latest.label("latest_json")).where(
        # (VARCHAR[], not the column's VARCHAR(40)[]: a cast to it would cut a longer id.)
        Run.id == any_(bindparam("run_ids", type_=ARRAY(String())))
    )


# A run's page on a miss, read on the driver's cursor (``prepared``).
_PAGES_AT_ONCE = Prepared(_at_once())
_PAGE_RUN, _PAGE_EVENTS = Prepared(_RUN), Prepared(_EVENTS)
_PAGE_LATEST = Prepared(LATEST_OF_RUN)


@lru_cache(maxsize=8)
def page_query(by_status: bool, by_team: bool, after: bool) -> Select[*tuple[Any, ...]]:
    """Summaries newest first; parameters ``limit``, and ``status`` (a list), ``team``,
    ``cursor`` (runs before this id) for the filters asked for."""
    query = select(*SUMMARY_COLUMNS).order_by(Run.id.desc()).limit(bindparam("limit"))
    if by_status:
        query = query.where(Run.status.in_(bindparam("status", expanding=True)))
    if by_team:
        query = query.where(Run.team == bindparam("team"))
    if after:
        query = query.where(Run.id < bindparam("cursor"))
    return query


async def ended_attempts(db: Database, run: Any) -> Sequence[Any]:
    """The ended attempts of a run (none to read for a run on its first)."""
    if (run.attempt or 1) <= 1:
        return ()

    def read() -> Sequence[Any]:
        with db.read() as session:
            return attempts.ended(session, run.id)

    return await db.run_read(read)

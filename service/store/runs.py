"""Reads of runs that several routes share: a constant number of queries each."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any, TypeAlias

from sqlalchemy import Row, Select, bindparam, select
from sqlalchemy.orm import Session

from service.errors import NotFound
from service.store.models import Run, RunEvent

AnyRow: TypeAlias = Row[*tuple[Any, ...]]

# What a run's page shows (``schemas.run_doc``), without the claim and idempotency columns.
SUMMARY_COLUMNS = (
    Run.id,
    Run.name,
    Run.recipe,
    Run.team,
    Run.priority,
    Run.status,
    Run.health,
    Run.health_reason,
    Run.queue_reason,
    Run.created_at,
    Run.submitted_at,
    Run.started_at,
    Run.ended_at,
    # A summary shows progress against the planned total, kept in the launch.
    Run.launch["total_steps"].as_integer().label("total_steps"),
)
RUN_COLUMNS = (
    *SUMMARY_COLUMNS,
    Run.spec,
    Run.launch,
    Run.ray_status,
    Run.ray_message,
    Run.ray_error_type,
    Run.ray_exit_code,
    Run.stop_requested_at,
    Run.preflight,
    Run.failure,
)
EVENT_COLUMNS = (
    RunEvent.id,
    RunEvent.at,
    RunEvent.from_status,
    RunEvent.to_status,
    RunEvent.reason,
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

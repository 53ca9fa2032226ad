"""Reads of runs that several routes share: a constant number of queries each."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeAlias, Unpack

from sqlalchemy import Row, select
from sqlalchemy.orm import Session

from service.errors import NotFound
from service.store.models import Run, RunEvent

AnyRow: TypeAlias = Row[Unpack[tuple[Any, ...]]]

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


def run_row(session: Session, run_id: str) -> AnyRow:
    """The columns of one run that its page shows (one query, no ORM object)."""
    row = session.execute(select(*RUN_COLUMNS).where(Run.id == run_id)).one_or_none()
    if row is None:
        raise NotFound(f"no run {run_id!r}")
    return row


def require_run(session: Session, run_id: str) -> None:
    if session.scalar(select(Run.id).where(Run.id == run_id)) is None:
        raise NotFound(f"no run {run_id!r}")


def events_of(session: Session, run_id: str) -> Sequence[AnyRow]:
    return session.execute(
        select(*EVENT_COLUMNS).where(RunEvent.run_id == run_id).order_by(RunEvent.id)
    ).all()

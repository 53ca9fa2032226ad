"""Reads of one run that several routes share."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.errors import NotFound
from service.store.models import Run, RunEvent


def load_run(session: Session, run_id: str, lock: bool = False) -> Run:
    run = session.get(Run, run_id, with_for_update=lock)
    if run is None:
        raise NotFound(f"no run {run_id!r}")
    return run


def events_of(session: Session, run_id: str) -> list[RunEvent]:
    return list(
        session.scalars(select(RunEvent).where(RunEvent.run_id == run_id).order_by(RunEvent.id))
    )

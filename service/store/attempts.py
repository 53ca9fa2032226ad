"""A run's ended attempts in ``run_attempts``: archived once each, read for its page."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.recovery.attempts import job_id
from service.store.models import Run, RunAttempt
from service.store.status import attempt_outcome


def archive(session: Session, run: Run) -> None:
    """Keep the run's current (ended) attempt as a ``run_attempts`` row (in the caller's
    transaction; a second archive of the same attempt fails on the key)."""
    session.add(
        RunAttempt(
            run_id=run.id,
            n=run.attempt,
            ray_job_id=job_id(run.id, run.attempt),
            status=attempt_outcome(run.status, run.attempt_status),
            submitted_at=run.submitted_at,
            started_at=run.started_at,
            ended_at=run.ended_at,
            failure=run.failure,
            resumed_from_step=run.resumed_from_step,
        )
    )
    session.flush()


def ended(session: Session, run_id: str) -> Sequence[RunAttempt]:
    return session.scalars(
        select(RunAttempt).where(RunAttempt.run_id == run_id).order_by(RunAttempt.n)
    ).all()

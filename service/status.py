"""The run lifecycle: statuses, legal moves, and the one function that changes a run's status."""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import TYPE_CHECKING

from service.errors import Conflict

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from service.models import Run, RunEvent


class RunStatus(StrEnum):
    QUEUED = "QUEUED"
    SUBMITTED = "SUBMITTED"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"
    CANCELLED = "CANCELLED"
    LOST = "LOST"


TERMINAL = frozenset(
    {RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.STOPPED, RunStatus.CANCELLED, RunStatus.LOST}
)
ACTIVE = frozenset({RunStatus.SUBMITTED, RunStatus.RUNNING})

_ENDS = frozenset({RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.STOPPED, RunStatus.LOST})
# Polling may skip states (SUBMITTED -> SUCCEEDED); terminal states are final. A queued run
# fails without reaching Ray only when Ray refuses the job outright.
ALLOWED: dict[RunStatus, frozenset[RunStatus]] = {
    RunStatus.QUEUED: frozenset({RunStatus.SUBMITTED, RunStatus.CANCELLED, RunStatus.FAILED}),
    RunStatus.SUBMITTED: _ENDS | {RunStatus.RUNNING},
    RunStatus.RUNNING: _ENDS,
    **{s: frozenset() for s in TERMINAL},
}


class IllegalTransition(Conflict):
    title = "Illegal status transition"


def is_allowed(src: RunStatus, dst: RunStatus) -> bool:
    return dst in ALLOWED[src]


def transition(session: Session, run: Run, dst: RunStatus, reason: str) -> RunEvent:
    """Move ``run`` to ``dst``, stamp its timestamps and append a RunEvent; flush, never commit."""
    from service.models import RunEvent

    src = RunStatus(run.status)
    if not is_allowed(src, dst):
        raise IllegalTransition(f"run {run.id} cannot go from {src} to {dst}")
    now = datetime.now(UTC)
    run.status = dst
    run.updated_at = now
    if dst is RunStatus.SUBMITTED:
        run.submitted_at = now
    elif dst is RunStatus.RUNNING:
        run.started_at = now
    if dst in TERMINAL:
        run.ended_at = now
        run.claim_owner = None
        run.claim_expires_at = None
    event = RunEvent(run_id=run.id, at=now, from_status=src, to_status=dst, reason=reason)
    session.add(event)
    session.flush()
    return event


def note(session: Session, run: Run, reason: str) -> RunEvent:
    """Append an event that leaves the status as it is (a stop request, a change of health)."""
    from service.models import RunEvent

    run.updated_at = datetime.now(UTC)
    event = RunEvent(
        run_id=run.id,
        at=run.updated_at,
        from_status=run.status,
        to_status=run.status,
        reason=reason,
    )
    session.add(event)
    session.flush()
    return event

"""The one writer of a run's status, health and events: every change appends a ``RunEvent``, and
is announced in the same transaction (``store/announce.py``) to the listeners the upper floors
registered, the webhook outbox among them (its deliveries commit with the change)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import insert
from sqlalchemy.orm import Session

from service.clock import utcnow
from service.errors import Conflict
from service.store import announce, grants
from service.store.models import Run, RunEvent
from service.store.status import (
    ACTIVE,
    ENDED,
    RETRIED_OUTCOMES,
    TERMINAL,
    Health,
    RunStatus,
    is_allowed,
)


class IllegalTransition(Conflict):
    title = "Illegal status transition"


# POST /runs is the hottest write: new runs and their first events are two Core inserts (one
# statement each for a batch of runs), not a unit of work.
_INSERT_RUN = insert(Run)
_INSERT_EVENT = insert(RunEvent).returning(RunEvent.id, sort_by_parameter_order=True)
_RUN_COLUMNS = frozenset(Run.__table__.columns.keys())


def accept(session: Session, runs: Sequence[Run]) -> list[RunEvent]:
    """Store new QUEUED runs, each with its first event, in the session's transaction (never
    committed here). Each run is written as it is and stays out of the session; all are built
    alike (the same attributes set)."""
    if not runs:
        return []
    conn = session.connection()
    conn.execute(
        _INSERT_RUN, [{k: v for k, v in vars(run).items() if k in _RUN_COLUMNS} for run in runs]
    )
    firsts = [
        {
            "run_id": run.id,
            "at": run.created_at,
            "from_status": None,
            "to_status": RunStatus.QUEUED,
            "reason": "accepted",
            "attempt": 1,
        }
        for run in runs
    ]
    ids = conn.execute(_INSERT_EVENT, firsts).scalars().all()
    return [RunEvent(id=i, **first) for i, first in zip(ids, firsts, strict=True)]


def transition(session: Session, run: Run, dst: RunStatus, reason: str) -> RunEvent:
    """Move ``run`` to ``dst``, stamp its timestamps and append a RunEvent; flush, never commit."""
    src = RunStatus(run.status)
    if not is_allowed(src, dst):
        raise IllegalTransition(f"run {run.id} cannot go from {src} to {dst}")
    now = utcnow()
    run.status = dst
    run.updated_at = now
    if dst is RunStatus.SUBMITTED:
        run.submitted_at = now
    elif dst is RunStatus.RUNNING:
        run.started_at = now
    if dst in TERMINAL:
        run.attempt_status = None  # the run's status says how its last attempt ended
    if dst in ENDED and src not in ENDED:  # the attempt's end (RETRYING -> FAILED is not one)
        run.ended_at = now
        run.claim_owner = None
        run.claim_expires_at = None
        announce.ended(session, run, now)
        grants.purge(session, run.id)
    event = _event(session, run, src, dst, reason, now)
    if dst in TERMINAL and run.submitted_at is None:
        announce.ended_off_ray(session, run)  # never on Ray: no log to wait for
    announce.event(session, run, event, "run.status")
    # run.failed goes out once the failure is known: when the log is read (recovery.explain).
    return event


def end_attempt(
    session: Session, run: Run, outcome: RunStatus, reason: str, retrying: bool
) -> RunEvent:
    """End the current attempt FAILED or LOST: the run ends so, or, when a next attempt may
    follow (``retrying``), it is RETRYING with ``outcome`` beside it until the decision
    (``requeue``, or ``finish``)."""
    if outcome not in RETRIED_OUTCOMES:
        raise IllegalTransition(f"an attempt ends FAILED or LOST, not {outcome}")
    if not retrying:
        return transition(session, run, outcome, reason)
    run.attempt_status = outcome
    return transition(session, run, RunStatus.RETRYING, reason)


def finish(session: Session, run: Run, reason: str) -> RunEvent:
    """End a RETRYING run as its attempt ended: no next attempt follows."""
    if run.status != RunStatus.RETRYING or run.attempt_status is None:
        raise IllegalTransition(f"run {run.id} is not deciding on a retry: it is {run.status}")
    return transition(session, run, RunStatus(run.attempt_status), reason)


def requeue(session: Session, run: Run, reason: str) -> RunEvent:
    """Start the next attempt of an ended run: back to QUEUED, from RETRYING (by its policy)
    or from a terminal status (by hand: the one move out of one). The caller has archived the
    attempt that ended (``recovery.attempts.archive``)."""
    src = RunStatus(run.status)
    if src not in ENDED:
        raise IllegalTransition(f"run {run.id} has not ended: it is {src}")
    now = utcnow()
    run.attempt += 1
    run.status = RunStatus.QUEUED
    run.updated_at = now
    run.submitted_at = run.started_at = run.ended_at = None
    run.claim_owner = run.claim_expires_at = run.stop_requested_at = None
    run.ray_status = run.ray_message = run.ray_error_type = None
    run.ray_exit_code = None
    run.ray_ended_at = None  # the next job's end is its own (recovery.ending)
    run.failure = None
    run.resumed_from_step = None
    run.attempt_status = None
    run.health, run.health_reason = "ok", None
    event = _event(session, run, src, RunStatus.QUEUED, reason, now)
    announce.event(session, run, event, "run.status")
    announce.event(session, run, event, "run.retrying", attempt=run.attempt)
    return event


def note(session: Session, run: Run, reason: str) -> RunEvent:
    """Append an event that leaves the status as it is (a stop request, a change of health)."""
    run.updated_at = utcnow()
    return _event(session, run, run.status, run.status, reason, run.updated_at)


def request_stop(session: Session, run: Run, reason: str | None = None) -> bool:
    """Ask for an active run to be stopped (the reconciler delivers it to Ray), or a RETRYING
    one to end as its attempt did (no next attempt follows); returns whether this is a new
    request."""
    if run.status == RunStatus.RETRYING and run.stop_requested_at is None:
        run.stop_requested_at = utcnow()
        finish(session, run, f"{reason or 'stop requested'}: no next attempt follows")
        return True
    if run.status not in ACTIVE or run.stop_requested_at is not None:
        return False
    run.stop_requested_at = utcnow()
    note(session, run, f"stop requested: {reason}" if reason else "stop requested")
    return True


def set_health(session: Session, run: Run, health: Health, reason: str | None) -> bool:
    """Record a change of health (with an event); returns whether anything changed."""
    if run.health == health and run.health_reason == reason:
        return False
    run.health = health
    run.health_reason = reason
    event = note(session, run, f"health {health}: {reason or 'recovered'}")
    announce.event(session, run, event, "run.health")
    return True


def _event(
    session: Session, run: Run, src: str | None, dst: str, reason: str, at: datetime
) -> RunEvent:
    event = RunEvent(
        run_id=run.id, at=at, from_status=src, to_status=dst, reason=reason, attempt=run.attempt
    )
    session.add(event)
    session.flush()
    return event

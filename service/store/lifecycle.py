"""The one writer of a run's status, health and events: every change appends a ``RunEvent``, and
is announced in the same transaction (``store/announce.py``) to the listeners the upper floors
registered, the webhook outbox among them (its deliveries commit with the change)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from sqlalchemy import insert
from sqlalchemy.orm import Session

from service.clock import utcnow
from service.errors import Conflict
from service.store import announce, grants
from service.store.models import Run, RunEvent
from service.store.status import (
    ACTIVE,
    DRAINING_NODE,
    ENDED,
    PREEMPTED_FOR,
    RETRIED_OUTCOMES,
    TERMINAL,
    Health,
    RunStatus,
    is_allowed,
)


class IllegalTransition(Conflict, title="Illegal status transition"): ...


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
    if src not in ENDED and not (src in ACTIVE and run.attempt_status == RunStatus.STOPPED):
        raise IllegalTransition(f"run {run.id} has not ended: it is {src}")
    now = utcnow()
    run.attempt += 1
    run.status = RunStatus.QUEUED
    run.updated_at = now
    run.submitted_at = run.started_at = run.ended_at = None
    run.claim_owner = run.claim_expires_at = run.stop_requested_at = None
    # The next attempt saves its own checkpoints, and gets its own deadline at admission.
    run.checkpoint_step = run.checkpoint_at = run.checkpoint_every_s = None
    run.yield_by = run.yield_after_step = run.yield_then = run.yield_reason = None
    run.stop_saved_step = run.stop_lost_steps = None
    run.deadline_at = None
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


def preempting(run: Run) -> bool:
    """Whether ``run`` stops because a preemption (or a draining node) asked it to: its yield
    was for one, and its stop came from that yield (a cancel meanwhile ends it as a cancel
    would)."""
    reason = run.yield_reason or ""
    return reason.startswith((PREEMPTED_FOR, DRAINING_NODE)) and run.stop_lost_steps is not None


def end_preempted(session: Session, run: Run) -> None:
    """End a preempted run's attempt, its job stopped (at its checkpoint, or when its grace ran
    out), without ending the run: its accelerator time is counted and its grants purged, and
    the attempt reads STOPPED (``attempt_status``) until ``requeue`` starts the next one in the
    same transaction, so the run never reads a terminal status."""
    if run.status not in ACTIVE:
        raise IllegalTransition(f"run {run.id} is not active: it is {run.status}")
    now = utcnow()
    run.ended_at = now
    run.attempt_status = RunStatus.STOPPED
    announce.ended(session, run, now)
    grants.purge(session, run.id)


def note(
    session: Session, run: Run, reason: str, kind: str | None = None, step: int | None = None
) -> RunEvent:
    """Append an event that leaves the status as it is (a stop request, a change of health, a
    checkpoint: ``kind`` and ``step`` say which)."""
    run.updated_at = utcnow()
    return _event(session, run, run.status, run.status, reason, run.updated_at, kind, step)


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


# Stop at the next checkpoint. Whoever wants an active run to end without losing work (a cancel
# with ``at: next_checkpoint``, its deadline, its target, a preemption) calls ``request_yield``;
# the follower reports each complete save (``checkpoint_saved``), which stops a yielding run
# at once, and the reconciler stops one whose ``yield_by`` passed first (``yield_overdue``).
# Either way ``request_stop`` follows, and the reconciler ends the run ``yield_then`` once Ray
# has stopped its job (``yield_end``), with the step it saved and the steps it lost.


def request_yield(
    session: Session,
    run: Run,
    within_s: float,
    reason: str,
    then: RunStatus = RunStatus.STOPPED,
    after_step: int | None = None,
) -> bool:
    """Ask an active run to stop right after its next complete checkpoint (one past the newest
    it has, and past ``after_step`` if given), or ``within_s`` from now whatever it has saved,
    whichever comes first; it then ends ``then`` (STOPPED, or SUCCEEDED for a target reached)
    saying ``reason``. A run already yielding keeps its request, made sooner if this one's
    time is; returns whether anything changed."""
    if then not in (RunStatus.STOPPED, RunStatus.SUCCEEDED):
        raise IllegalTransition(f"a run that yields ends STOPPED or SUCCEEDED, not {then}")
    if run.status not in ACTIVE or run.stop_requested_at is not None:
        return False
    now = utcnow()
    by = now + timedelta(seconds=within_s)
    if run.yield_by is not None:
        if by >= run.yield_by:
            return False
        run.yield_by = by
        if run.yield_then == then:
            run.yield_reason = reason
        note(
            session,
            run,
            f"stop at the next checkpoint now within {within_s:.0f} s: {reason}",
            kind="stop_requested",
        )
        return True
    run.yield_by = by
    known = [s for s in (run.checkpoint_step, after_step) if s is not None]
    run.yield_after_step = max(known) if known else None
    run.yield_then = then
    run.yield_reason = reason
    event = note(
        session,
        run,
        f"stop at the next checkpoint requested (within {within_s:.0f} s): {reason}",
        kind="stop_requested",
    )
    announce.event(session, run, event, "run.stop_requested")
    return True


def checkpoint_saved(
    session: Session, run: Run, step: int, logged: int | None, at: datetime | None = None
) -> RunEvent | None:
    """Record a complete checkpoint of the current attempt at ``step`` (``logged``: the newest
    step the run had logged when it was saved); a run yielding for it is asked to stop now.
    A step not past the newest known is no news (None)."""
    if run.checkpoint_step is not None and step <= run.checkpoint_step:
        return None
    now = at or utcnow()
    since = run.checkpoint_at or run.started_at or run.submitted_at
    if since is not None:
        gap = (now - since).total_seconds()
        run.checkpoint_every_s = max(gap, run.checkpoint_every_s or 0.0)
    run.checkpoint_step = step
    run.checkpoint_at = now
    event = note(session, run, f"checkpoint: step {step} saved", kind="checkpoint", step=step)
    announce.event(session, run, event, "run.checkpoint", step=step)
    waiting = run.yield_by is not None and run.stop_requested_at is None
    if (
        waiting
        and run.status in ACTIVE
        and (run.yield_after_step is None or step > run.yield_after_step)
    ):
        lost = max(0, (logged or step) - step)
        _yield_now(session, run, step, lost, f"checkpoint at step {step} saved")
    return event


def yield_overdue(session: Session, run: Run, logged: int | None) -> bool:
    """Stop a yielding run whose time ran out before its next checkpoint (``logged``: the
    newest step it logged); returns whether it was asked to stop now."""
    if run.yield_by is None or run.stop_requested_at is not None or run.status not in ACTIVE:
        return False
    base = run.checkpoint_step if run.checkpoint_step is not None else run.resumed_from_step
    lost = max(0, (logged or 0) - (base or 0))
    saved = run.checkpoint_step
    what = f"since step {saved}" if saved is not None else "with no checkpoint saved"
    _yield_now(session, run, saved, lost, f"no checkpoint in time: {lost} steps lost {what}")
    return True


def _yield_now(session: Session, run: Run, saved: int | None, lost: int, why: str) -> None:
    run.stop_saved_step = saved
    run.stop_lost_steps = lost
    request_stop(session, run, f"{why} ({run.yield_reason})")


def yield_settled(session: Session, run: Run, logged: int | None) -> bool:
    """At the final read of a run that yielded: had its job saved a newer checkpoint after the
    stop was decided (the service was down, or Ray slow to stop it), that one is where a retry
    resumes, and the steps past it are what was lost; said in a note. Returns whether so."""
    saved = run.checkpoint_step
    if run.yield_then is None or run.stop_requested_at is None or saved is None:
        return False
    if run.stop_saved_step is not None and saved <= run.stop_saved_step:
        return False
    lost = max(0, (logged or saved) - saved)
    run.stop_saved_step, run.stop_lost_steps = saved, lost
    note(
        session,
        run,
        f"the job saved checkpoint step {saved} before it stopped: a retry resumes there, "
        f"{lost} steps lost",
    )
    return True


def yield_end(run: Run) -> tuple[RunStatus, str] | None:
    """How a run that yielded ends once Ray has stopped its job: (status, reason); None when
    it was not yielding."""
    if run.yield_then is None or run.stop_requested_at is None:
        return None
    saved = run.stop_saved_step
    at = f"at checkpoint step {saved}" if saved is not None else "with no checkpoint"
    lost = run.stop_lost_steps or 0
    return RunStatus(run.yield_then), f"{run.yield_reason}: stopped {at}, {lost} steps lost"


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
    session: Session,
    run: Run,
    src: str | None,
    dst: str,
    reason: str,
    at: datetime,
    kind: str | None = None,
    step: int | None = None,
) -> RunEvent:
    event = RunEvent(
        run_id=run.id,
        at=at,
        from_status=src,
        to_status=dst,
        reason=reason,
        attempt=run.attempt,
        kind=kind,
        step=step,
    )
    session.add(event)
    session.flush()
    return event

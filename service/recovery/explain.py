"""A run's failure, settled once it has ended: from its state (cancelled, stopped by the
service or elsewhere, lost) or, for a run that failed, from its kept log and Ray's word."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, replace
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.metrics import logcopy
from service.notify import outbox
from service.recovery.classify import Evidence, Failure, classify
from service.recovery.rules import KILLED
from service.store import audit
from service.store.models import Run, RunEvent, RunLog
from service.store.status import RunStatus, attempt_outcome

KILLED_OUTSIDE = KILLED.cls
# The end of the kept log the classifier reads (the decisive lines are near the end).
READ_CHARS = 1_000_000


def failure_of(session: Session, run: Run, ray_state: Sequence[str] = ()) -> Failure | None:
    """Why ``run``'s current attempt ended as it did; None for one that succeeded or has not
    ended."""
    status = RunStatus(attempt_outcome(run.status, run.attempt_status))
    hang = _held(run) if run.health == "unschedulable" else None
    if hang is not None and status is RunStatus.STOPPED and run.stop_requested_at is not None:
        return hang  # stopped because it could never start: the hang is why
    if status is RunStatus.CANCELLED:
        return Failure("cancelled", "cancelled before it was submitted", "")
    if status is RunStatus.STOPPED:
        # The reconciler marks a stop nobody asked the service for (health stopped_outside).
        if run.stop_requested_at is None or run.health == "stopped_outside":
            return Failure(
                "stopped_outside",
                "stopped on the cluster, not through rlrun",
                "see the audit trail and the cluster's unmanaged jobs for who stopped it",
            )
        if run.yield_reason is not None:  # stopped at (or waiting for) its next checkpoint
            saved = run.stop_saved_step
            at = f"at checkpoint step {saved}" if saved is not None else "with no checkpoint"
            summary = f"{run.yield_reason}: stopped {at}, {run.stop_lost_steps or 0} steps lost"
            hint = "retry resumes it from its newest complete checkpoint"
            return Failure("cancelled", summary, hint if saved is not None else "")
        return Failure("cancelled", "stopped at the service's request", "")
    if status not in (RunStatus.FAILED, RunStatus.LOST):
        return None
    text, start = kept_tail(session, run.id)
    found = classify(
        text,
        start,
        run.ray_error_type,
        run.ray_message or "",
        "\n".join(ray_state),
        run.ray_exit_code,
        shared=log_shared(run),
    )
    if hang is not None and found.cls == "unknown":
        return hang
    if status is RunStatus.LOST and found.cls == "unknown":
        return Failure(
            "node_lost",
            "Ray no longer knows the job (its head restarted, or the job was removed)",
            "retry the run; a head that restarts should keep its jobs (GCS fault tolerance)",
            found.evidence,  # the log's last error lines, if any
        )
    return found


def log_shared(run: Run) -> bool:
    """Whether other teams' jobs could write ``run``'s log: it was accepted (authentication on)
    for clusters other teams' runs go to too (``shared_on``), and runs on one of them."""
    shared = run.launch.get("shared_on") or []
    return bool(shared) and (run.cluster is None or run.cluster in shared)


def kept_tail(session: Session, run_id: str) -> tuple[str, int]:
    """The last ``READ_CHARS`` of the run's kept log, and the log offset where they start: of
    the current attempt's job only (a later attempt is judged by its own log, not by what ended
    the one before)."""
    base = session.scalar(select(RunLog.log_base).where(RunLog.run_id == run_id)) or 0
    start = max(base, logcopy.end(session, run_id) - READ_CHARS)
    text, _ = logcopy.since(session, run_id, start)
    return text, start


def settle(
    session: Session,
    run: Run,
    failure: Failure | None = None,
    ray_state: Sequence[str] = (),
    short: str | None = None,
) -> None:
    """Record ``run``'s failure (once its log is all read, or ``short`` says why it was not;
    ``failure`` when the caller has found it already; ``ray_state``: Ray's state API's lines on
    the job, ``recovery.deaths``) and, if the run has failed for good, tell ``run.failed``
    subscribers, with the class (a RETRYING run is told once its retry is decided against:
    ``announce``)."""
    session.flush()  # the log's last lines, added in this transaction, are read back
    failure = failure or failure_of(session, run, ray_state)
    if failure is not None and short:
        failure = replace(failure, summary=f"{failure.summary} ({short})")
    run.failure = None if failure is None else as_doc(failure)
    if failure is not None and failure.cls == KILLED_OUTSIDE:
        audit.by_cluster(session, "run.killed_outside", run_id=run.id, target=run.team)
    announce(session, run)


def announce(session: Session, run: Run) -> None:
    """Tell ``run.failed`` subscribers of a run that has ended FAILED, its failure settled."""
    ending = ending_event(session, run) if run.status == RunStatus.FAILED else None
    if ending is not None:
        outbox.enqueue(session, run, ending, "run.failed", failure=run.failure)


def hold(run: Run, failure: Failure | None) -> None:
    """The failure of a run that has not ended (a hang found on Ray); None clears it. Its end
    settles it again (``settle``)."""
    run.failure = None if failure is None else as_doc(failure)


def _held(run: Run) -> Failure | None:
    doc = run.failure
    if not doc:
        return None
    evidence = [Evidence(e.get("offset"), str(e.get("line", ""))) for e in doc.get("evidence", [])]
    return Failure(str(doc["class"]), str(doc["summary"]), str(doc["hint"]), evidence)


def as_doc(failure: Failure) -> dict[str, Any]:
    doc = asdict(failure)
    doc["class"] = doc.pop("cls")
    return doc


def ending_event(session: Session, run: Run) -> RunEvent | None:
    """The event that moved ``run`` into its present status."""
    return session.scalars(
        select(RunEvent)
        .where(
            RunEvent.run_id == run.id,
            RunEvent.to_status == run.status,
            RunEvent.from_status != run.status,
        )
        .order_by(RunEvent.id.desc())
        .limit(1)
    ).first()

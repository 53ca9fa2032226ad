"""Retries: a next attempt of a run that ended, by its policy or by hand.

By policy: once a FAILED or LOST run's log is read to the end and its failure class is known
(``explain.settle``), a class the policy names, with attempts left and no stop asked for,
starts the next attempt: the run goes back to QUEUED, admitted again after the backoff at the
head of its priority, and resumes from its checkpoint. By hand: ``POST /runs/{id}/retry`` on
any ended run, from its checkpoint or from scratch. The ended attempt is archived first, in the
same transaction, so each attempt is recorded and submitted once. A cancel during the backoff
cancels the queued run: no later attempt follows a cancel or a stop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Literal

from sqlalchemy.orm import Session

from service.clock import utcnow
from service.errors import Conflict
from service.recovery.policy import in_force
from service.retry_policy import RetryPolicy
from service.store import attempts
from service.store.lifecycle import requeue
from service.store.models import Run, RunLog
from service.store.status import TERMINAL, RunStatus

ResumeFrom = Literal["checkpoint", "scratch"]
RETRIED_STATUSES = frozenset({RunStatus.FAILED, RunStatus.LOST})


@dataclass(frozen=True)
class RetryConfig:
    """The operator's side of every policy (settings ``retry_*``)."""

    default: RetryPolicy | None = None
    per_team: dict[str, int] = field(default_factory=dict)
    max_attempts: int = 3


def due(run: Run, config: RetryConfig) -> tuple[RetryPolicy, str] | None:
    """The policy and the failure class by which ``run`` (settled) gets another attempt."""
    if run.status not in RETRIED_STATUSES or run.stop_requested_at is not None:
        return None
    policy = in_force(run.spec, run.team, config.default, config.per_team, config.max_attempts)
    cls = (run.failure or {}).get("class")
    if policy is None or cls not in policy.on or run.attempt >= policy.max_attempts:
        return None
    return policy, str(cls)


def after_settle(session: Session, run: Run, config: RetryConfig) -> bool:
    """Start the next attempt if the policy says so (in the settling transaction); whether it
    did."""
    found = due(run, config)
    if found is None:
        return False
    policy, cls = found
    n = run.attempt + 1
    why = f"retrying: attempt {n} of {policy.max_attempts} after {cls}"
    if policy.backoff_s:
        why += f", in {policy.backoff_s:g}s"
    _next(session, run, "checkpoint", policy.backoff_s, why)
    return True


def by_hand(session: Session, run: Run, resume: ResumeFrom, who: str) -> None:
    """Start the next attempt of an ended run now (409 while it has not ended)."""
    if run.status not in TERMINAL:
        raise Conflict(f"run {run.id} has not ended: it is {run.status}", status_of_run=run.status)
    n = run.attempt + 1
    _next(session, run, resume, 0.0, f"retrying: attempt {n} from {resume}, asked by {who}")


def _next(session: Session, run: Run, resume: ResumeFrom, backoff_s: float, why: str) -> None:
    attempts.archive(session, run)
    runlog = session.get(RunLog, run.id, with_for_update=True)
    requeue(session, run, why)
    run.resume = resume
    run.retry_at = utcnow() + timedelta(seconds=backoff_s) if backoff_s else None
    if runlog is not None:
        # The next job's log continues the kept copy; its follower starts again.
        runlog.log_base = runlog.log_offset
        runlog.finished_at = None
        runlog.lease_owner = runlog.lease_expires_at = None

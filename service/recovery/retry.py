"""Retries: a next attempt of a run that ended, by its policy or by hand.

By policy: an attempt that ends FAILED or LOST while its policy may start another leaves the run
RETRYING (``end_attempt``), never a terminal status that would then change. Once its log is
read to the end and its failure class is known (``explain.settle``), a class the policy names,
with attempts left and no stop asked for, starts the next attempt: the run goes back to QUEUED,
admitted again after the backoff at the head of its priority, and resumes from its checkpoint;
any other class ends the run as its attempt ended. By hand: ``POST /runs/{id}/retry`` on
any ended run, from its checkpoint or from scratch. The ended attempt is archived first, in the
same transaction, so each attempt is recorded and submitted once. A cancel during the backoff
cancels the queued run: no later attempt follows a cancel or a stop.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

from sqlalchemy.orm import Session

from service.clock import utcnow
from service.errors import Conflict
from service.notify import outbox
from service.recovery import explain
from service.recovery.policy import in_force
from service.retry_policy import RetryPolicy
from service.store import attempts, lifecycle
from service.store.models import Run, RunEvent, RunLog
from service.store.status import ENDED, TERMINAL, RunStatus, attempt_outcome

ResumeFrom = Literal["checkpoint", "scratch"]


@dataclass(frozen=True)
class RetryConfig:
    """The operator's side of every policy (settings ``retry_*``)."""

    default: RetryPolicy | None = None
    per_team: dict[str, int] = field(default_factory=dict)
    max_attempts: int = 3


def _policy(run: Run, config: RetryConfig) -> RetryPolicy | None:
    return in_force(run.spec, run.team, config.default, config.per_team, config.max_attempts)


def may_retry(run: Run, config: RetryConfig) -> bool:
    """Whether a next attempt may follow the current one should it fail: a policy in force
    with classes to retry and attempts left, and no stop asked for (the class, known once the
    log is read, decides)."""
    policy = _policy(run, config)
    if policy is None or run.stop_requested_at is not None:
        return False
    return bool(policy.on) and run.attempt < policy.max_attempts


def end_attempt(
    session: Session, run: Run, outcome: RunStatus, reason: str, config: RetryConfig
) -> None:
    """End the current attempt FAILED or LOST: RETRYING while a next attempt may follow, else
    the run's end."""
    lifecycle.end_attempt(session, run, outcome, reason, may_retry(run, config))


def due(
    run: Run, config: RetryConfig, earlier: Sequence[str] = ()
) -> tuple[RetryPolicy, str] | str:
    """The policy and the failure class by which RETRYING ``run`` (settled) gets another
    attempt, or why it gets none (``earlier``: the failure classes of its ended attempts
    before this one)."""
    policy = _policy(run, config)
    cls = str((run.failure or {}).get("class", "unknown"))
    if run.stop_requested_at is not None:
        return "a stop was asked for"
    if policy is None:
        return "no retry policy"
    if cls not in policy.on:
        return f"its policy does not retry {cls}"
    if run.attempt >= policy.max_attempts:
        return f"attempt {run.attempt} of {policy.max_attempts} was the last"
    if cls in ONCE and cls in earlier:
        return f"{cls} is retried once, and an earlier attempt ended with it too"
    return policy, cls


# Classes worth one retry at most, whatever the policy's attempts: a host that ran out of
# memory may have been crowded by other work once; twice, the run itself does not fit.
ONCE: tuple[str, ...] = ("host_oom",)


def _earlier_classes(session: Session, run: Run) -> list[str]:
    return [
        str(a.failure.get("class"))
        for a in attempts.ended(session, run.id)
        if a.n < run.attempt and a.failure
    ]


def after_settle(session: Session, run: Run, config: RetryConfig) -> bool:
    """The ended attempt's failure is settled (in the settling transaction): a RETRYING run
    starts its next attempt if its policy names the class, else ends as its attempt did.
    ``run.attempt_ended`` subscribers hear of the attempt first. Whether a next attempt
    started."""
    if run.status not in ENDED:
        return False
    n, outcome = run.attempt, attempt_outcome(run.status, run.attempt_status)
    told = {"n": n, "status": outcome, "failure": run.failure}
    end = explain.ending_event(session, run)  # the event that ended the attempt
    retrying = run.status == RunStatus.RETRYING
    found = due(run, config, _earlier_classes(session, run)) if retrying else "ended"
    if end is not None:
        _tell(session, run, end, told, None if isinstance(found, str) else n + 1)
    if found == "ended":
        return False
    if isinstance(found, str):
        lifecycle.finish(session, run, f"not retried: {found}")
        explain.announce(session, run)
        return False
    policy, cls = found
    why = f"retrying: attempt {n + 1} of {policy.max_attempts} after {cls}"
    if policy.backoff_s:
        why += f", in {policy.backoff_s:g}s"
    _next(session, run, "checkpoint", policy.backoff_s, why)
    return True


def _tell(
    session: Session, run: Run, event: RunEvent, attempt: dict[str, Any], next_attempt: int | None
) -> None:
    """``run.attempt_ended``: the ended attempt (n, status, failure) and the next one, if any."""
    outbox.enqueue(
        session, run, event, "run.attempt_ended", attempt=attempt, next_attempt=next_attempt
    )


def by_hand(session: Session, run: Run, resume: ResumeFrom, who: str) -> None:
    """Start the next attempt of an ended run now (409 while it has not ended)."""
    if run.status not in TERMINAL:
        raise Conflict(f"run {run.id} has not ended: it is {run.status}", status_of_run=run.status)
    n = run.attempt + 1
    _next(session, run, resume, 0.0, f"retrying: attempt {n} from {resume}, asked by {who}")


def preempted(session: Session, run: Run, why: str) -> None:
    """A preempted run whose job stopped: its attempt ends STOPPED and the next one waits in
    the queue at once, resuming from its checkpoint (one run, one history; no retry policy
    is asked, and no attempt of its policy is spent)."""
    lifecycle.end_preempted(session, run)
    _next(session, run, "checkpoint", 0.0, why)


def _next(session: Session, run: Run, resume: ResumeFrom, backoff_s: float, why: str) -> None:
    attempts.archive(session, run)
    runlog = session.get(RunLog, run.id, with_for_update=True)
    lifecycle.requeue(session, run, why)
    run.resume = resume
    run.retry_at = utcnow() + timedelta(seconds=backoff_s) if backoff_s else None
    if runlog is not None:
        # The next job's log continues the kept copy; its follower starts again.
        runlog.log_base = runlog.log_offset
        runlog.finished_at = None
        runlog.lease_owner = runlog.lease_expires_at = None

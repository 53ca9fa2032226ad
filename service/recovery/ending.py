"""A truthful end: a job Ray reports SUCCEEDED ends its run SUCCEEDED only once the run's log is
read to the end and shows every planned step trained (or, with no plan known, no fatal error).
Otherwise the run ends FAILED with the class found in the log (``ended_early`` when none is),
naming the step reached.

Ray counts a job's exit code, not its training: verl's rollouter can fail, hand the trainer an
end of data, and the job exits 0 having trained part of the run (verl issue 6387). So the
reconciler only records Ray's word (``ray_succeeded``) and the follower decides at its final
read (``at_final_read``), in one transition: a run never shows SUCCEEDED and then flips. Should
the log not be read to the end within ``WAIT`` of Ray's word, the reconciler decides from what
is stored, and says so in the event.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from datetime import datetime, timedelta

from sqlalchemy.orm import Session

from service.metrics import logcopy, store
from service.metrics.keys import progress_key
from service.metrics.parse import parse_synced
from service.recovery import explain, retry
from service.recovery.classify import Evidence, Failure, classify
from service.recovery.retry import RetryConfig
from service.store.lifecycle import note, transition
from service.store.models import Run
from service.store.status import ACTIVE, RunStatus

WAIT = timedelta(seconds=60)
# A run ``conclude`` ended FAILED, or RETRYING, is settled already.
_CONCLUDED = frozenset({RunStatus.FAILED, RunStatus.RETRYING})
# Where a fatal error starts: a Python traceback, or Ray's error raised in the driver.
_FATAL = re.compile(r"Traceback \(most recent call last\)|ray\.exceptions\.\w+Error")
_STEP_LINE = re.compile(r"step:\d+ - ")
_SYNC_MARK = "_fit_update_weights"  # what a line ``parse_synced`` reads holds (a cheap filter)
# verl's rollouter says how many samples it will produce (fully_async_rollouter.py).
_ROLLOUT_TOTAL = re.compile(r"\[FullyAsyncRollouter\] Total rollout steps: (\d+)")
_EARLY_HINT = (
    "the log names no cause: look above the last step for the rollouter's or the trainer's "
    "error (verl's rollouter that fails hands the trainer an end of data, verl issue 6387), "
    "and check the data covers the planned steps (data.train_files, trainer.total_epochs)"
)


def verdict(session: Session, run: Run) -> Failure | None:
    """Why ``run``, whose job exited 0, did not succeed; None when it did (every planned step
    trained, or no plan known and no fatal error in its log)."""
    text, start = explain.kept_tail(session, run.id)
    plan = run.launch.get("total_steps")
    total = plan if isinstance(plan, int) and plan > 0 else None
    reached = _reached(session, run)
    if total is not None and reached < total:
        reached = max(reached, _synced_by_trainer(session, run.id))
        total = _planned_by_job(session, run, total)
    short = total is not None and reached < total
    steps = f"trained {reached} of {total} steps"
    # A traceback in the log of a run that trained every planned step was survived (a caught
    # error, a retried actor): it ends the run only short of its plan, or with no plan known.
    fatal = _fatal(text, start) if short or total is None else None
    if fatal is not None and fatal.cls != "unknown":
        also = f"; {steps}" if short else ""
        summary = f"{fatal.summary} (the job exited 0{also})"
        return Failure(fatal.cls, summary, fatal.hint, fatal.evidence)
    if not short:
        return None
    # The last step, then the last error lines of a traceback no rule names (the rollouter's).
    unnamed = fatal.evidence if fatal is not None else []
    return Failure(
        "ended_early",
        f"{steps}: the job exited 0 before the end of the run",
        _EARLY_HINT,
        _last_step_line(text, start) + unnamed,
    )


def ray_succeeded(session: Session, run: Run, now: datetime, config: RetryConfig) -> None:
    """Ray reports ``run``'s job SUCCEEDED: note it once; end the run from the stored log only
    when the follower has not read it to the end within ``WAIT`` (and decide on a retry then,
    as the follower would have)."""
    if run.ray_ended_at is None:
        run.ray_ended_at = now
        note(session, run, "Ray reports the job finished; the run ends once its log is read")
    elif now - run.ray_ended_at > WAIT:
        wait = f"{WAIT.total_seconds():g} s"
        why = f" (from the log stored so far: not read to the end in {wait})"
        conclude(session, run, config, why)
        retry.after_settle(session, run, config)


def at_final_read(
    session: Session,
    run: Run,
    config: RetryConfig,
    ray_state: Sequence[str] = (),
    short: str | None = None,
) -> None:
    """The follower has read ``run``'s log to the end: end it if Ray's success waits for
    that, and settle its failure (once: a run ended by ``conclude`` is settled already;
    ``ray_state``: what Ray's state API says died under the job; ``short``: why the end was
    not read, the decision made on the log kept). The caller decides on a retry next
    (``retry.after_settle``)."""
    if run.status in ACTIVE:
        conclude(session, run, config, f" ({short})" if short else "")
    elif not (run.status in _CONCLUDED and run.ray_ended_at is not None):
        explain.settle(session, run, ray_state=ray_state, short=short)


def conclude(session: Session, run: Run, config: RetryConfig, why: str = "") -> None:
    """End ``run``'s attempt, whose job Ray reports SUCCEEDED, as its log shows (one
    transition: SUCCEEDED, or FAILED, RETRYING if a next attempt may follow)."""
    session.flush()  # the log's last lines and points, added in this transaction, are read
    failure = verdict(session, run)
    if failure is None:
        transition(session, run, RunStatus.SUCCEEDED, f"the job finished successfully{why}")
        explain.settle(session, run)
        return
    reason = f"{failure.cls}: {failure.summary}{why}"[:1000]
    retry.end_attempt(session, run, RunStatus.FAILED, reason, config)
    explain.settle(session, run, failure)


def _planned_by_job(session: Session, run: Run, total: int) -> int:
    """``total``, or fewer syncs when the job planned fewer rollout samples than the spec
    asked (verl: the smaller of ``rollout.total_rollout_steps`` and the data's size, which only
    the job knows and logs once, near the start)."""
    per_sync = run.launch.get("samples_per_sync")
    if not isinstance(per_sync, int) or per_sync < 1:
        return total
    text, _ = logcopy.since(session, run.id, 0)
    planned = [int(m[1]) for m in _ROLLOUT_TOTAL.finditer(text)]
    return min(total, planned[-1] // per_sync) if planned else total


def _synced_by_trainer(session: Session, run_id: str) -> int:
    """The newest parameter version the trainer's own lines say it synced (0: none), read from
    the kept log: what the stored points hold too, unless the run's metric limits dropped them.
    verl's ``step:`` lines lag (``metrics.parse``)."""
    text, _ = logcopy.since(session, run_id, 0)
    lines = (line for line in text.splitlines() if _SYNC_MARK in line)
    return max((v for line in lines if (v := parse_synced(line)) is not None), default=0)


def _reached(session: Session, run: Run) -> int:
    """The run's newest parameter version (its progress of ``total_steps``)."""
    value = store.latest(session, run.id).get(progress_key(run.launch), (0, 0.0))[1]
    return int(value) if math.isfinite(value) else 0


def _fatal(text: str, start: int) -> Failure | None:
    """A fatal error in the log: what the classifier finds from the first traceback (or Ray
    error) on (``unknown`` with its last error lines when no rule names it); None without
    one."""
    match = _FATAL.search(text)
    if match is None:
        return None
    at = text.rfind("\n", 0, match.start()) + 1
    return classify(text[at:], start + at)


def _last_step_line(text: str, start: int) -> list[Evidence]:
    at = 0
    last: Evidence | None = None
    for line in text.splitlines(keepends=True):
        if _STEP_LINE.search(line):
            last = Evidence(start + at, line.rstrip()[:300])
        at += len(line)
    return [] if last is None else [last]

"""The reconciler: polls Ray for every active run and records what Ray says.

A job Ray reports SUCCEEDED does not end its run here: the follower ends it once the log is
read to the end, SUCCEEDED or, having trained short of its plan, FAILED
(``service.recovery.ending``).

It also delivers stop requests. A run Ray no longer knows (404) is LOST: Ray keeps no durable
state, so after a head restart our database is the only record of it. A job Ray reports STOPPED
that the service never asked to stop (no stop request: not a cancel, not the watchdog) was
stopped outside the service, e.g. by another job through Ray's Jobs API: the run says so in its
event and health, and the audit trail has a row with the cluster as the actor.

Each run is read on its own: a Ray error for one run (a 500, a timeout) puts that run alone on a
backoff and, once it persists, into health ``ray_error`` saying why; the others go on. When every
read of a round fails, Ray itself is down and the round fails (the loop backs off).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import ClassVar

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from service.backoff import Backoff
from service.cluster.ray_jobs import JobInfo, RayJobs, RayRejected, RayUnavailable, stop_job
from service.cluster.registry import Clusters, UnknownCluster
from service.recovery import ending, retry
from service.recovery.attempts import job_id
from service.recovery.retry import RetryConfig
from service.scheduling import deadlines
from service.store import audit
from service.store.db import Database
from service.store.lifecycle import (
    preempting,
    request_yield,
    set_health,
    transition,
    yield_end,
    yield_overdue,
)
from service.store.models import Run, RunLog, utcnow
from service.store.status import ACTIVE, ENDED, RECONCILER_HEALTH, RunStatus

log = logging.getLogger(__name__)

_NO_RETRY = RetryConfig()
_RAY_TO_RUN = {
    "RUNNING": RunStatus.RUNNING,
    "SUCCEEDED": RunStatus.SUCCEEDED,
    "FAILED": RunStatus.FAILED,
    "STOPPED": RunStatus.STOPPED,
}


@dataclass
class _Retry:
    failures: int
    next_at: float


@dataclass
class Reconciler:
    db: Database
    ray: RayJobs | Clusters  # a lone client: the one ``default`` cluster
    # Called after a round in which some run ended (its resources are free for the queue).
    on_end: Callable[[], None] = lambda: None
    interval_s: float = 2.0
    max_backoff_s: float = 30.0
    retry_config: RetryConfig = _NO_RETRY  # whether a failed attempt leaves its run RETRYING
    deadline_margin_s: float = 300.0  # a run is asked to yield this long before its deadline
    _retry: dict[str, _Retry] = field(default_factory=dict, init=False)
    clusters: Clusters = field(init=False)

    # A run's reads fail this many times in a row before its health says so (a blip is not news).
    HEALTH_AFTER: ClassVar[int] = 2
    WORKERS: ClassVar[int] = 8

    def __post_init__(self) -> None:
        self.clusters = Clusters.lift(self.ray)

    def tick(self) -> None:
        self._stops()
        with self.db.transaction() as session:
            rows = session.execute(
                select(Run.id, Run.stop_requested_at, Run.attempt, Run.cluster).where(
                    Run.status.in_(ACTIVE)
                )
            ).all()
        # A run on a cluster that is down is not asked after: the health loop ends it.
        down = self.clusters.down()
        primary = self.clusters.primary.name
        active = [(i, s, n, c) for i, s, n, c in rows if (c or primary) not in down]
        now = time.monotonic()
        due = [
            (i, s, n, c)
            for i, s, n, c in active
            if now >= getattr(self._retry.get(i), "next_at", now)
        ]
        # Read in parallel: one run that makes Ray time out delays no other.
        with ThreadPoolExecutor(max_workers=self.WORKERS) as pool:
            results = list(pool.map(lambda row: self._observe(*row), due))
        observed = {
            i: r for (i, _, _, _), r in zip(due, results, strict=True) if not isinstance(r, str)
        }
        failed = {i: r for (i, _, _, _), r in zip(due, results, strict=True) if isinstance(r, str)}
        still = {i for i, _, _, _ in active} - observed.keys()
        self._retry = {i: r for i, r in self._retry.items() if i in still}
        for run_id in failed:
            pause = self._retry.setdefault(run_id, _Retry(0, now))
            pause.failures += 1
            pause.next_at = now + Backoff(self.interval_s, self.max_backoff_s).delay(pause.failures)
        ended = False
        if observed or failed:
            # Rows are locked in run id order, the follower's order: no deadlock between them.
            # One statement for every run of the round (not one per run: each would flush the
            # runs already changed).
            ids = list(observed.keys() | failed.keys())
            with self.db.transaction() as session:
                locked = session.scalars(
                    select(Run).where(Run.id.in_(ids)).order_by(Run.id).with_for_update()
                ).all()
                for run in locked:
                    if run.id in failed:
                        self._note_failure(session, run, failed[run.id])
                        continue
                    if run.status in ACTIVE:
                        if run.health == "ray_error":
                            set_health(session, run, "ok", None)
                        apply(session, run, observed[run.id], self.retry_config)
                        ended = ended or run.status in ENDED
        if ended:
            self.on_end()
        if failed and not observed:
            first = next(iter(failed.values()))
            raise RayUnavailable(f"every read of this round failed; first: {first}")

    def _stops(self) -> None:
        """Ask runs near their deadline to stop at their next checkpoint; stop runs whose wait
        for one ran out (this round then delivers the stop)."""
        now = utcnow()
        with self.db.read() as session:
            rows = session.execute(
                select(Run.id, Run.yield_by, Run.deadline_at, Run.checkpoint_every_s).where(
                    Run.status.in_(ACTIVE),
                    Run.stop_requested_at.is_(None),
                    or_(Run.yield_by.is_not(None), Run.deadline_at.is_not(None)),
                )
            ).all()
        margin = self.deadline_margin_s
        due = sorted(
            i
            for i, by, deadline, every in rows
            if (by is not None and by <= now)
            or (
                deadline is not None
                and (by is None or by > deadline)
                and (deadline - now).total_seconds() <= deadlines.margin_s(margin, every)
            )
        )
        if not due:
            return
        with self.db.transaction() as session:
            locked = session.execute(
                select(Run, RunLog.last_step)
                .outerjoin(RunLog, RunLog.run_id == Run.id)
                .where(Run.id.in_(due))
                .order_by(Run.id)
                .with_for_update(of=Run)
            ).all()
            for run, logged in locked:
                if run.stop_requested_at is not None or run.status not in ACTIVE:
                    continue
                deadline = run.deadline_at
                if deadline is not None and (run.yield_by is None or run.yield_by > deadline):
                    left = max(0.0, (deadline - now).total_seconds())
                    limit = (deadline - (run.submitted_at or deadline)).total_seconds()
                    request_yield(session, run, left, f"deadline: {limit:g} s from admission")
                if run.yield_by is not None and run.yield_by <= now:
                    yield_overdue(session, run, logged)

    def _observe(
        self, run_id: str, stop_requested_at: datetime | None, attempt: int, cluster: str | None
    ) -> JobInfo | str | None:
        """What the run's cluster says of its current attempt, or the error (as text) that
        kept it from saying."""
        job = job_id(run_id, attempt)
        try:
            ray = self.clusters.of(cluster).ray
            if stop_requested_at is not None:
                stop_job(ray, job, "stop requested")
            return ray.get(job)
        except (RayUnavailable, RayRejected, UnknownCluster) as exc:
            log.warning("reconciler: reading run %s from Ray failed: %s", run_id, exc)
            return str(exc)

    def _note_failure(self, session: Session, run: Run, error: str) -> None:
        retry = self._retry[run.id]
        if retry.failures < self.HEALTH_AFTER:
            return
        if run.status in ACTIVE and run.health in RECONCILER_HEALTH:
            reason = f"Ray fails to report this run (retrying with backoff): {error}"
            set_health(session, run, "ray_error", reason[:1000])


def apply(
    session: Session, run: Run, info: JobInfo | None, config: RetryConfig = _NO_RETRY
) -> None:
    """Fold one observation of Ray into the run (through the one transition function)."""
    if info is None:
        run.ray_status = None
        why = (
            f"Ray no longer knows job {job_id(run.id, run.attempt)} "
            "(the Ray head restarted or the job was deleted)"
        )
        retry.end_attempt(session, run, RunStatus.LOST, why, config)
        return
    # Set only what changed: an unchanged run stays clean (nothing for the flush to look at).
    said = {
        "ray_status": info.status,
        "ray_message": info.message,
        "ray_error_type": info.error_type,
        "ray_exit_code": info.driver_exit_code,
    }
    for column, value in said.items():
        if getattr(run, column) != value:
            setattr(run, column, value)
    target = _RAY_TO_RUN.get(info.status)
    if target is None or target == run.status:
        return
    if target is RunStatus.SUCCEEDED:
        ending.ray_succeeded(session, run, utcnow(), config)  # ends once its log is read
        return
    if target is RunStatus.STOPPED and run.stop_requested_at is None:
        stopped_outside(session, run)
        return
    yielded = yield_end(run) if target is RunStatus.STOPPED else None
    if yielded is not None:  # stopped at (or waiting for) its next checkpoint, as asked
        if preempting(run):
            n = run.attempt + 1
            retry.preempted(
                session, run, f"{yielded[1]}; attempt {n} waits to resume from its checkpoint"
            )
            return
        transition(session, run, *yielded)
        return
    if target is RunStatus.FAILED:
        retry.end_attempt(session, run, target, _reason(info), config)
        return
    transition(session, run, target, _reason(info))


STOPPED_OUTSIDE = "stopped outside rlrun"


def stopped_outside(session: Session, run: Run) -> None:
    """End a run whose job someone stopped on Ray without the service asking: event, health
    and an audit row, all in the reconciler's transaction."""
    why = "Ray reports the job STOPPED, but the service never asked to stop it"
    transition(session, run, RunStatus.STOPPED, f"{STOPPED_OUTSIDE}: {why}")
    set_health(session, run, "stopped_outside", f"{STOPPED_OUTSIDE} ({why})")
    audit.by_cluster(session, "run.stopped_outside", run_id=run.id, target=run.team)


def _reason(info: JobInfo) -> str:
    if info.status == "RUNNING":
        return "Ray reports the job running"
    if info.status == "SUCCEEDED":
        return "the job finished successfully"
    if info.status == "STOPPED":
        return "the job was stopped"
    parts = [info.error_type or "job failed"]
    if info.driver_exit_code is not None:
        parts.append(f"exit code {info.driver_exit_code}")
    if info.message:
        parts.append(info.message.strip().splitlines()[-1][:500])
    return ": ".join(parts)

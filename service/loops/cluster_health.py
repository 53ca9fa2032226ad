"""Cluster health: each cluster's head probed every interval; a cluster is down once every probe
has failed for a whole window (``RLRUN_CLUSTER_DOWN_AFTER_S``), up again at its first answer.

When a cluster goes down, its SUBMITTED and RUNNING runs end LOST with the failure class
``cluster_down`` (in this loop's transaction, each through the one transition function); a run
whose retry policy names that class goes back to the queue at once as its next attempt, and
admission places it on another cluster while its own is down. Queued runs avoid a down cluster
(admission is told it is down) and the other loops leave its runs alone. Nothing is restarted
when it comes back: the next probe that answers marks it up, and the jobs it still runs for
runs that ended or went on elsewhere meanwhile are stopped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from service.clock import utcnow
from service.cluster.ray_jobs import RayJobs, RayRejected, RayUnavailable, stop_job
from service.cluster.registry import ClusterHandle, Clusters
from service.recovery import explain, retry
from service.recovery.attempts import job_id, runs_of_jobs
from service.recovery.classify import Failure
from service.recovery.retry import RetryConfig
from service.store import audit
from service.store.db import Database
from service.store.models import Run, RunLog
from service.store.status import ACTIVE, RunStatus

log = logging.getLogger(__name__)
_ALIVE = frozenset({"PENDING", "RUNNING"})


@dataclass
class ClusterHealth:
    db: Database
    clusters: Clusters
    window_s: float
    probe_timeout_s: float = 2.0
    retry: RetryConfig = field(default_factory=RetryConfig)
    # Called after a cluster went down or came back (admission has another map now).
    on_change: Callable[[], None] = lambda: None
    clock: Callable[[], datetime] = utcnow
    # A client per cluster with the probe's short timeout (the loops' clients wait longer).
    _probes: dict[str, RayJobs] = field(default_factory=dict, init=False)

    def _probe(self, handle: ClusterHandle) -> str | None:
        """None when the head answers; else why not."""
        ray = self._probes.get(handle.name)
        if ray is None:
            ray = handle.ray
            if type(ray) is RayJobs:  # a real client: its own, quicker to give up
                ray = RayJobs(ray.address, ray.token, self.probe_timeout_s)
            self._probes[handle.name] = ray
        try:
            ray.version()
        except RayUnavailable as exc:
            return str(exc) or type(exc).__name__
        return None

    def tick(self) -> None:
        handles = list(self.clusters)
        with ThreadPoolExecutor(max_workers=len(handles)) as pool:
            errors = list(pool.map(self._probe, handles))
        changed = False
        for handle, error in zip(handles, errors, strict=True):
            change = handle.health.observe(error is None, self.window_s, self.clock(), error)
            if change == "down":
                log.warning(
                    "cluster %s is down: its head has not answered for %.0f s (%s)",
                    handle.name,
                    self.window_s,
                    error,
                )
                with self.db.transaction() as session:
                    audit.by_cluster(session, "cluster.down", target=handle.name)
            elif change == "up":
                log.warning("cluster %s is up again", handle.name)
                with self.db.transaction() as session:
                    audit.by_cluster(session, "cluster.up", target=handle.name)
                self._stop_stale(handle)
            changed = changed or change is not None
        # Every tick while down, not once: a round that failed (a lock wait, a deadlock the
        # database broke) is made good by the next.
        for handle in handles:
            if not handle.health.up:
                changed = self._down(handle) or changed
        if changed:
            self.on_change()

    def _down(self, handle: ClusterHandle) -> bool:
        """End the active runs on a cluster that is down; whether there were any."""
        name = handle.name
        on_it = Run.cluster == name
        if handle is self.clusters.primary:
            on_it = or_(on_it, Run.cluster.is_(None))
        with self.db.read() as session:
            ids = session.scalars(
                select(Run.id).where(Run.status.in_(ACTIVE), on_it).order_by(Run.id)
            ).all()
        if not ids:
            return False
        with self.db.transaction() as session:
            # One run at a time in run id order, its log row after it, as the follower does:
            # no deadlock between loops.
            for run_id in ids:
                run = session.get(Run, run_id, with_for_update=True)
                if run is not None:
                    lose(session, run, name, self.retry)
        return True

    def _stop_stale(self, handle: ClusterHandle) -> None:
        """Stop the jobs a cluster that is back still runs for runs that ended, or went on
        elsewhere, while it was down (a head cut off, not restarted, kept them running): a run
        runs in one place only."""
        try:
            alive = [j.submission_id for j in handle.ray.list_jobs() if j.status in _ALIVE]
        except (RayUnavailable, RayRejected) as exc:
            log.warning("cluster %s: listing its jobs failed: %s", handle.name, exc)
            return
        runs = runs_of_jobs(alive)
        with self.db.read() as session:
            rows = session.execute(
                select(Run.id, Run.status, Run.attempt, Run.cluster).where(
                    Run.id.in_(set(runs.values()))
                )
            ).all()
        current = {
            job_id(r.id, r.attempt)
            for r in rows
            if r.status in ACTIVE and (r.cluster or self.clusters.primary.name) == handle.name
        }
        ours = {r.id for r in rows}
        for job in alive:
            if runs[job] in ours and job not in current:
                try:
                    stop_job(handle.ray, job, "its run ended or went on elsewhere")
                except (RayUnavailable, RayRejected) as exc:
                    log.warning("cluster %s: stopping job %s failed: %s", handle.name, job, exc)
                    continue
                log.warning(
                    "cluster %s: stopped job %s, its run went on without it", handle.name, job
                )


def lose(session: Session, run: Run, cluster: str, config: RetryConfig) -> None:
    """End ``run`` LOST with its cluster down, settled at once (its log cannot be read there
    any more), and start its next attempt if its policy names ``cluster_down``."""
    if run.status not in ACTIVE:
        return
    why, was = f"cluster {cluster} down", run.status
    retry.end_attempt(session, run, RunStatus.LOST, why, config)
    explain.settle(
        session,
        run,
        Failure(
            "cluster_down",
            f"{why}: its Ray head stopped answering while the run was {was}",
            "retry the run; a retry policy with `cluster_down` in `on` moves it to another "
            "cluster at once",
        ),
    )
    runlog = session.get(RunLog, run.id, with_for_update=True)
    if runlog is not None:
        runlog.finished_at = utcnow()
        runlog.lease_owner = runlog.lease_expires_at = None
    retry.after_settle(session, run, config)

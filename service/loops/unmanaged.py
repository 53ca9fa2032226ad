"""Jobs on the cluster that are no runs of the service: each one seen is recorded once in the
audit trail, and with ``stop_after_s`` (an admin's setting, off by default) a submission older
than that is stopped through Ray's Jobs API, with an audit row of its own.

Drivers that connected to the cluster directly are seen and recorded but cannot be stopped
through the Jobs API; they are left alone. Ray's start time of a job is its age, so every
replica agrees on it; the audit trail says what was already recorded, so no replica records a
job twice (a replica remembers what it found there, and asks again only of jobs new to it).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.cluster.inventory_cache import InventoryCache
from service.cluster.ray_jobs import RayJobs, RayRejected, RayUnavailable
from service.cluster.registry import ClusterHandle, Clusters
from service.scheduling.outside import ClusterJob, unmanaged
from service.store import audit
from service.store.db import Database
from service.store.models import AuditEntry

log = logging.getLogger(__name__)

SEEN, STOPPED = "job.unmanaged", "job.stopped_unmanaged"


@dataclass
class UnmanagedJobs:
    db: Database
    ray: RayJobs | Clusters  # a lone client: the one ``default`` cluster
    inventory: InventoryCache | None  # a lone client's inventory (clusters carry their own)
    stop_after_s: float | None = None
    # Jobs (by id) whose audit rows this replica knows of, per action.
    _recorded: dict[str, set[str]] = field(
        default_factory=lambda: {SEEN: set(), STOPPED: set()}, init=False
    )
    clusters: Clusters = field(init=False)

    def __post_init__(self) -> None:
        self.clusters = Clusters.lift(self.ray, self.inventory)

    def tick(self) -> None:
        """Each cluster that is up on its own; the round fails only when every one does."""
        handles = [h for h in self.clusters if h.health.up]
        errors: list[Exception] = []
        for handle in handles:
            try:
                self._tick(handle)
            except (RayUnavailable, RayRejected) as exc:
                log.warning("unmanaged: reading cluster %s failed: %s", handle.name, exc)
                errors.append(exc)
        if errors and len(errors) == len(handles):
            raise errors[0]

    def _tick(self, handle: ClusterHandle) -> None:
        jobs = handle.inventory.get().jobs
        if not jobs:
            return
        now_ms = time.time() * 1000
        with self.db.transaction() as session:
            foreign = unmanaged(session, jobs)
            seen = self._new(session, SEEN, foreign)
            for job in seen:
                self._record(session, SEEN, job)
            due = self._new(session, STOPPED, [j for j in foreign if self._due(j, now_ms)])
        self._recorded[SEEN].update(j.id for j in seen)
        stopped = [job for job in due if self._stop(handle.ray, job)]
        if stopped:
            with self.db.transaction() as session:
                for job in stopped:
                    self._record(session, STOPPED, job)
            self._recorded[STOPPED].update(j.id for j in stopped)

    def _due(self, job: ClusterJob, now_ms: float) -> bool:
        if self.stop_after_s is None or job.type != "SUBMISSION" or job.start_time_ms is None:
            return False
        return now_ms - job.start_time_ms >= self.stop_after_s * 1000

    def _stop(self, ray: RayJobs, job: ClusterJob) -> bool:
        try:
            ray.stop(job.id)
        except RayRejected as exc:
            log.warning("stopping unmanaged job %s: Ray refused: %s", job.id, exc)
            return False
        log.warning("stopped job %s: it is no run of rlrun (%s)", job.id, job.entrypoint)
        return True

    def _new(self, session: Session, action: str, jobs: Iterable[ClusterJob]) -> list[ClusterJob]:
        """The ``jobs`` the audit trail has no ``action`` row for yet."""
        known = self._recorded[action]
        unknown = [j for j in jobs if j.id not in known]
        if unknown:
            ids = [j.id for j in unknown]
            query = select(AuditEntry.target).where(
                AuditEntry.action == action, AuditEntry.target.in_(ids)
            )
            known.update(t for t in session.scalars(query) if t)
        return [j for j in unknown if j.id not in known]

    def _record(self, session: Session, action: str, job: ClusterJob) -> None:
        audit.by_cluster(session, action, target=job.id)

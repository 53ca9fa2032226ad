"""The watchdog: finds runs that hang (health ``unschedulable``) or are stuck (health ``stuck``)
and, by policy, stops the stuck ones.

Unschedulable: a RUNNING run without a new step for ``unschedulable_after_s`` whose job has an
actor pending creation or a placement group pending that no node's free resources can hold, as
Ray's state API shows (``recovery.pending``); its ``failure`` names the missing shape. It clears
once Ray shows nothing of the kind. Stuck, the last resort: submitted but not RUNNING within
``submitted_s`` (Ray cannot start it), or RUNNING without log output for ``silent_s`` (a spec's
``stuck_after_s`` sets both for its run). A run with no recorded output counts as silent since
it started.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from sqlalchemy import select

from service.cluster.ray_jobs import RayJobs, RayRejected, RayUnavailable
from service.cluster.registry import Clusters
from service.recovery import explain, pending
from service.recovery.attempts import job_id
from service.recovery.classify import Evidence, of_class
from service.scheduling.inventory import Inventory
from service.store.db import Database
from service.store.lifecycle import request_stop, set_health
from service.store.models import Run, RunLog, utcnow
from service.store.status import ACTIVE, WATCHDOG_HEALTH, RunStatus

log = logging.getLogger(__name__)


class Watchdog:
    def __init__(
        self,
        db: Database,
        submitted_s: float,
        silent_s: float,
        stop_stuck: bool,
        on_stop: Callable[[], None] = lambda: None,
        ray: RayJobs | Clusters | None = None,
        unschedulable_after_s: float = 20.0,
    ) -> None:
        self.db = db
        self.submitted = timedelta(seconds=submitted_s)
        self.silent = timedelta(seconds=silent_s)
        self.stop_stuck = stop_stuck
        self.on_stop = on_stop
        # Ray's state API is asked on each run's own cluster (a lone client: ``default``).
        self.clusters = None if ray is None else Clusters.lift(ray)
        self.unschedulable_after = timedelta(seconds=unschedulable_after_s)

    def tick(self) -> None:
        now = utcnow()
        probed, hangs = self._probe(now)
        stopping = False
        with self.db.transaction() as session:
            query = select(Run).where(Run.status.in_(ACTIVE), Run.health.in_(WATCHDOG_HEALTH))
            # Locked in run id order, as every loop locks runs: no deadlock between loops.
            for run in session.scalars(query.order_by(Run.id).with_for_update()):
                hang = hangs.get(run.id)
                if hang is not None and run.status == RunStatus.RUNNING:
                    set_health(session, run, "unschedulable", hang[:1000])
                    evidence = [Evidence(None, f"Ray's state API: {hang}")]
                    explain.hold(run, of_class("unschedulable", hang, evidence))
                elif run.health == "unschedulable" and run.id in probed:
                    set_health(session, run, "ok", None)  # placed since: it runs
                    explain.hold(run, None)
                reason = self.stuck_reason(run, now)
                if reason is None:
                    if run.health == "stuck":
                        set_health(session, run, "ok", None)
                    continue
                if run.health != "unschedulable":  # the more exact word stands
                    set_health(session, run, "stuck", reason)
                if self.stop_stuck and request_stop(session, run, f"stuck ({reason})"):
                    stopping = True
        if stopping:
            self.on_stop()

    def _probe(self, now: datetime) -> tuple[set[str], dict[str, str]]:
        """The RUNNING runs without a recent step that Ray's state API was asked about, and of
        those, the ones whose job waits for a shape no node can hold (run -> that shape)."""
        if self.clusters is None:
            return set(), {}
        with self.db.read() as session:
            rows = session.execute(
                select(Run.id, Run.attempt, Run.started_at, RunLog.last_step_at, Run.cluster)
                .outerjoin(RunLog, RunLog.run_id == Run.id)
                .where(Run.status == RunStatus.RUNNING, Run.health.in_(WATCHDOG_HEALTH))
            ).all()
        # cluster -> run -> its current attempt's Ray job (the submission id Ray's state API
        # names)
        jobs: dict[str, dict[str, str]] = {}
        for i, attempt, started, step, cluster in rows:
            if now - (step or started or now) > self.unschedulable_after:
                handle = self.clusters.get(cluster)
                if handle is not None and handle.health.up:
                    jobs.setdefault(handle.name, {})[i] = job_id(i, attempt)
        due: set[str] = set()
        hangs: dict[str, str] = {}
        for name, mine in jobs.items():
            ray = self.clusters.of(name).ray
            try:  # no transaction is open across these calls
                waiting = pending.read(ray)
                free = Inventory.from_cluster_status(ray.cluster_status()).available()
            except (RayUnavailable, RayRejected, KeyError, TypeError, ValueError) as exc:
                log.warning("watchdog: reading what waits on cluster %s failed: %r", name, exc)
                continue
            due |= set(mine)
            for i, job in mine.items():
                if (missing := pending.missing(waiting, job, free)) is not None:
                    hangs[i] = missing
        return due, hangs

    def stuck_reason(self, run: Run, now: datetime) -> str | None:
        own = (run.spec or {}).get("stuck_after_s")
        submitted = self.submitted if own is None else timedelta(seconds=float(own))
        silent = self.silent if own is None else timedelta(seconds=float(own))
        if run.status == RunStatus.SUBMITTED:
            since = run.submitted_at or run.updated_at
            if now - since > submitted:
                return (
                    f"not RUNNING {submitted.total_seconds():g} s after submission "
                    f"(Ray: {run.ray_status or 'unknown'})"
                )
        elif run.status == RunStatus.RUNNING:
            since = run.last_output_at or run.started_at or run.updated_at
            if now - since > silent:
                return f"no log output for {silent.total_seconds():g} s while RUNNING"
        return None

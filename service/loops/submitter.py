"""The submitter: claims queued runs that fit and submits each to Ray exactly once.

The run id is Ray's ``submission_id``; a claim lapses if its replica dies, and the retry that
follows gets "already exists" from Ray, which counts as submitted. No DB transaction is held
across a Ray call.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import or_, select

import jobs
from service.admission import Inventory, admit
from service.db import Database
from service.models import Run, utcnow
from service.ray_jobs import RayJobs, RayRejected, RayUnavailable
from service.recipes.base import ResourceShape
from service.status import ACTIVE, RunStatus, transition

log = logging.getLogger(__name__)
JOBS_DIR = Path(jobs.__file__).parent


@dataclass(frozen=True)
class Claimed:
    id: str
    launch: dict[str, Any]


class Submitter:
    def __init__(
        self, db: Database, ray: RayJobs, owner: str, claim_ttl_s: float, batch: int
    ) -> None:
        self.db = db
        self.ray = ray
        self.owner = owner
        self.claim_ttl = timedelta(seconds=claim_ttl_s)
        self.batch = batch

    def tick(self) -> None:
        inventory = Inventory.from_cluster_status(self.ray.cluster_status())
        with self.db.transaction() as session:
            claimed = self._claim(session, inventory)
        for run in claimed:
            self._submit(run)

    def _claim(self, session: Any, inventory: Inventory) -> list[Claimed]:
        now = utcnow()
        unclaimed = or_(Run.claim_expires_at.is_(None), Run.claim_expires_at < now)
        query = (
            select(Run)
            .where(Run.status == RunStatus.QUEUED, unclaimed)
            .order_by(Run.priority.desc(), Run.id)
            .limit(self.batch)
        )
        if self.db.is_postgres:
            query = query.with_for_update(skip_locked=True)
        queued = list(session.scalars(query))
        if not queued:
            return []
        # What the service holds: active runs, and queued runs other replicas are submitting.
        held_rows = session.scalars(
            select(Run.launch).where(
                or_(Run.status.in_(ACTIVE), (Run.status == RunStatus.QUEUED) & ~unclaimed)
            )
        )
        held = [ResourceShape.from_dict(launch["shape"]) for launch in held_rows]
        order = [(r.id, ResourceShape.from_dict(r.launch["shape"])) for r in queued]
        chosen = set(admit(order, held, inventory))
        out = []
        for run in queued:
            if run.id in chosen:
                run.claim_owner = self.owner
                run.claim_expires_at = now + self.claim_ttl
                out.append(Claimed(run.id, run.launch))
        return out

    def _submit(self, run: Claimed) -> None:
        launch = run.launch
        runtime_env = dict(launch["runtime_env"])
        runtime_env["py_modules"] = [
            *runtime_env.get("py_modules", []),
            self.ray.package_uri(JOBS_DIR),
        ]
        try:
            fresh = self.ray.submit(
                submission_id=run.id,
                entrypoint=launch["entrypoint"],
                runtime_env=runtime_env,
                metadata={"rlrun_run_id": run.id},
                entrypoint_num_cpus=launch.get("entrypoint_num_cpus", 0.0),
                entrypoint_resources=launch.get("entrypoint_resources") or None,
            )
        except RayRejected as exc:
            with self.db.transaction() as session:
                row = session.get(Run, run.id, with_for_update=True)
                if row is not None and row.status == RunStatus.QUEUED:
                    row.ray_message = str(exc)
                    transition(session, row, RunStatus.FAILED, f"Ray refused the job: {exc}")
            return
        except RayUnavailable:
            with self.db.transaction() as session:
                row = session.get(Run, run.id, with_for_update=True)
                if row is not None and row.claim_owner == self.owner:
                    row.claim_owner = row.claim_expires_at = None
            raise
        cancelled = False
        with self.db.transaction() as session:
            row = session.get(Run, run.id, with_for_update=True)
            if row is not None and row.status == RunStatus.QUEUED:
                row.ray_status = "PENDING"
                reason = "submitted to Ray" if fresh else "already on Ray (a retried submission)"
                transition(session, row, RunStatus.SUBMITTED, reason)
            cancelled = row is not None and row.status == RunStatus.CANCELLED
        if cancelled:
            log.info("run %s was cancelled while being submitted; stopping it on Ray", run.id)
            self.ray.stop(run.id)

"""The submitter: claims the queued runs admission lets through and submits each to Ray once.

The run id is Ray's ``submission_id`` (``<run id>-a<N>`` for attempt N >= 2,
``recovery.attempts``); a claim lapses if its replica dies, and the retry that
follows gets "already exists" from Ray, which counts as submitted. No DB transaction is held
across a Ray call.

A run that names secrets is submitted with a one-time grant in its env, never their values: its
launcher redeems the grant (``jobs.grant``, ``POST /grants/redeem``) and hands the values to the
job's processes, so they are not in Ray's job table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from sqlalchemy import update
from sqlalchemy.orm import Session

import jobs
from jobs import grant as job_grant
from jobs import resume
from service.client import DEFAULT_URL
from service.cluster.ray_jobs import RayJobs, RayRejected, RayUnavailable, stop_job, zip_files
from service.recipes.base import RUN_FILES_DIR
from service.recovery.attempts import job_id
from service.scheduling import backlog
from service.scheduling.admission import Quotas
from service.scheduling.budgets import Budgets
from service.scheduling.inventory import Inventory, InventoryCache
from service.scheduling.node_groups import NodeGroups, decide_grouped
from service.store import grants
from service.store.db import Database
from service.store.lifecycle import transition
from service.store.models import Run, utcnow
from service.store.status import RunStatus
from service.team_secrets import SecretStore, missing_message, redact

JOBS_DIR = Path(jobs.__file__).parent


@dataclass
class Submitter:
    db: Database
    ray: RayJobs
    inventory: InventoryCache
    quotas: Quotas
    owner: str
    claim_ttl_s: float
    batch: int  # runs admitted per round at most
    secrets: SecretStore = field(default_factory=lambda: SecretStore(None))
    grant_url: str = DEFAULT_URL  # where the job redeems its grant
    grant_ttl_s: float = 3600.0
    groups: NodeGroups = field(default_factory=NodeGroups)
    budgets: Budgets = field(default_factory=Budgets)

    def tick(self) -> None:
        # Always a fresh read: a run that just ended must not wait for a cache to expire.
        inventory = self.inventory.get(max_age_s=0.0)
        with self.db.transaction() as session:
            claimed = self._claim(session, inventory)
        for queued in claimed:
            self._submit(queued)

    def _claim(self, session: Session, inventory: Inventory) -> list[backlog.QueuedRow]:
        """Decide the round, claim the admitted runs and record why the others wait."""
        if not backlog.lock_admission(session):
            return []
        now = utcnow()
        rows = backlog.queued(session, now, claim=True)
        if not rows:
            return []
        held = backlog.held(session, now, inventory.fetched_at)
        outside = backlog.outside_jobs(session, inventory)
        over_budget = self.budgets.held_back(session, rows, now)
        offered = [r.run for r in rows if r.run.id not in over_budget]
        decision = decide_grouped(
            self.groups, offered, held, inventory, self.quotas, self.batch, outside
        )
        decision.reasons |= {run_id: o.reason for run_id, o in over_budget.items()}
        admitted = set(decision.admit)
        out = []
        for row in rows:
            run_id = row.run.id
            if run_id in admitted:
                claim = (
                    update(Run)
                    .where(Run.id == run_id, Run.status == RunStatus.QUEUED, backlog.unclaimed(now))
                    .values(
                        claim_owner=self.owner,
                        claim_expires_at=now + timedelta(seconds=self.claim_ttl_s),
                        queue_reason=None,
                        budget_wait=None,
                    )
                )
                if session.execute(claim).rowcount:  # type: ignore[attr-defined]
                    out.append(row)
            else:
                reason = decision.reasons.get(run_id)
                wait = over_budget[run_id].doc() if run_id in over_budget else None
                if (reason, wait) != (row.queue_reason, row.budget_wait):
                    session.execute(
                        update(Run)
                        .where(Run.id == run_id)
                        .values(queue_reason=reason, budget_wait=wait)
                    )
        return out

    def _submit(self, queued: backlog.QueuedRow) -> None:
        run, launch = queued.run, queued.launch
        job = job_id(run.id, queued.attempt)
        runtime_env = dict(launch["runtime_env"])
        if queued.attempt > 1:  # a later attempt: which one, and what it resumes from
            runtime_env["env_vars"] = {
                **runtime_env.get("env_vars", {}),
                resume.ATTEMPT_ENV: str(queued.attempt),
                resume.RESUME_ENV: queued.resume or "checkpoint",
            }
        refs = launch.get("secrets") or {}
        # Checked again now (no value read): a secret removed since the run was accepted.
        missing = self.secrets.unknown(run.team, refs)
        if missing:
            self._fail(run.id, missing_message(refs[missing[0]]))
            return
        token = ""
        if refs:
            with self.db.transaction() as session:
                token = grants.issue(session, run.id, job, self.grant_ttl_s)
            runtime_env["env_vars"] = {
                **runtime_env.get("env_vars", {}),
                job_grant.GRANT_ENV: token,
                job_grant.GRANT_URL_ENV: self.grant_url,
            }
            runtime_env["worker_process_setup_hook"] = job_grant.WORKER_HOOK
        try:
            runtime_env["py_modules"] = [
                *runtime_env.get("py_modules", []),
                self.ray.package_uri(JOBS_DIR),
            ]
            if launch.get("files"):  # the run's own files: its working directory on every node
                package = zip_files(launch["files"], RUN_FILES_DIR)
                runtime_env["working_dir"] = self.ray.upload(package)
            fresh = self.ray.submit(
                submission_id=job,
                entrypoint=launch["entrypoint"],
                runtime_env=runtime_env,
                metadata={"rlrun_run_id": run.id, "rlrun_attempt": str(queued.attempt)},
                entrypoint_num_cpus=launch.get("entrypoint_num_cpus", 0.0),
                # A team mapped to a node group: its driver starts on the group's nodes.
                entrypoint_resources={
                    **(launch.get("entrypoint_resources") or {}),
                    **self.groups.pin(run.team),
                }
                or None,
            )
        except RayRejected as exc:
            # Ray's message may quote the runtime env: the grant is not kept from it.
            self._fail(run.id, f"Ray refused the job: {redact(str(exc), [token])}")
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
            if row is not None and row.status == RunStatus.QUEUED and row.attempt == queued.attempt:
                row.ray_status = "PENDING"
                reason = "submitted to Ray" if fresh else "already on Ray (a retried submission)"
                if queued.attempt > 1:
                    reason += f" as {job} (attempt {queued.attempt})"
                transition(session, row, RunStatus.SUBMITTED, reason)
            cancelled = row is not None and row.status == RunStatus.CANCELLED
        if cancelled:
            stop_job(self.ray, job, "cancelled while being submitted")

    def _fail(self, run_id: str, reason: str) -> None:
        with self.db.transaction() as session:
            row = session.get(Run, run_id, with_for_update=True)
            if row is not None and row.status == RunStatus.QUEUED:
                row.ray_message = reason
                transition(session, row, RunStatus.FAILED, reason)

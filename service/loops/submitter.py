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

import logging
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import update
from sqlalchemy.orm import Session

import jobs
from jobs import grant as job_grant
from jobs import resume
from jobs import samples as job_samples
from service import usage
from service.client import DEFAULT_URL
from service.cluster.inventory_cache import InventoryCache
from service.cluster.ray_jobs import RayJobs, RayRejected, RayUnavailable, stop_job, zip_files
from service.cluster.registry import ClusterHandle, Clusters, cluster_quotas
from service.recipes.base import RUN_FILES_DIR
from service.recovery.attempts import job_id
from service.scheduling import backlog, deadlines, preemption
from service.scheduling.across import ClusterDecision, ClusterState, decide_across
from service.scheduling.admission import Quotas
from service.scheduling.budgets import Budgets
from service.scheduling.fair_share import recent_accelerators
from service.scheduling.inventory import Inventory
from service.scheduling.node_groups import NodeGroups
from service.scheduling.outside import held_outside
from service.scheduling.preemption import Policy
from service.store import announce, grants
from service.store.db import Database
from service.store.lifecycle import note, request_yield, transition
from service.store.models import Run, utcnow
from service.store.status import ACTIVE, RunStatus
from service.team_secrets import SecretStore, missing_message, redact

JOBS_DIR = Path(jobs.__file__).parent
# Set in every job's environment: Ray prints its autoscaler's events (any job's demand that no
# node fits) into every driver's log; another team's demands are not this run's to read.
CLUSTER_EVENTS_OFF = {"RAY_SCHEDULER_EVENTS": "0"}
log = logging.getLogger(__name__)


@dataclass
class Submitter:
    db: Database
    ray: RayJobs | Clusters  # a lone client: the one ``default`` cluster
    inventory: InventoryCache | None  # a lone client's inventory (clusters carry their own)
    quotas: Quotas
    owner: str
    claim_ttl_s: float
    batch: int  # runs admitted per round at most
    secrets: SecretStore = field(default_factory=lambda: SecretStore(None))
    grant_url: str = DEFAULT_URL  # where the job redeems its grant
    grant_ttl_s: float = 3600.0
    groups: NodeGroups = field(default_factory=NodeGroups)  # of the primary cluster
    budgets: Budgets = field(default_factory=Budgets)
    half_life_s: float = 0.0  # of past usage in a team's fair-share standing (0: no memory)
    preemption: Policy | None = None  # None: nothing running is preempted
    # Team -> the longest an attempt may last ("*": every team not named); with the spec's
    # ``max_duration_s``, the attempt's deadline from its admission.
    team_max_duration_s: Mapping[str, float] = field(default_factory=dict)
    clusters: Clusters = field(init=False)

    def __post_init__(self) -> None:
        self.clusters = Clusters.lift(self.ray, self.inventory)

    def tick(self) -> None:
        inventories = self._inventories()
        with self.db.transaction() as session:
            claimed = self._claim(session, inventories)
        for queued, cluster in claimed:
            self._submit(queued, cluster)

    def _inventories(self) -> dict[str, Inventory | None]:
        """A fresh inventory of each cluster that is up (a run that just ended must not wait
        for a cache to expire), read at once: a cluster slow to answer stalls no other. None
        for one down or unreadable; when every cluster fails, the round fails."""
        handles = list(self.clusters)

        def read(handle: ClusterHandle) -> Inventory | Exception | None:
            if not handle.health.up:
                return None
            try:
                return handle.inventory.get(max_age_s=0.0)
            except (RayUnavailable, RayRejected) as exc:
                log.warning("submitter: reading cluster %s failed: %s", handle.name, exc)
                return exc

        if len(handles) == 1:
            results = [read(handles[0])]
        else:
            with ThreadPoolExecutor(max_workers=len(handles)) as pool:
                results = list(pool.map(read, handles))
        errors = [r for r in results if isinstance(r, Exception)]
        if errors and len(errors) == len(handles):
            raise errors[0]
        return {
            h.name: r if isinstance(r, Inventory) else None
            for h, r in zip(handles, results, strict=True)
        }

    def _claim(
        self, session: Session, inventories: Mapping[str, Inventory | None]
    ) -> list[tuple[backlog.QueuedRow, str]]:
        """Decide the round, claim the admitted runs (each with its cluster) and record why
        the others wait."""
        if not backlog.lock_admission(session):
            return []
        now = utcnow()
        rows = backlog.queued(session, now, claim=True)
        if not rows:
            return []
        views = [
            backlog.ClusterView(
                h.name, inventories.get(h.name), h.health.down_reason, cluster_quotas(h.spec)
            )
            for h in self.clusters
        ]
        states = backlog.cluster_states(session, now, views, self.groups)
        over_budget = self.budgets.held_back(session, rows, now)
        offered = [r for r in rows if r.run.id not in over_budget]
        candidates = {r.run.id: self._candidates(r) for r in offered}
        recent = recent_accelerators(usage.recent(session, now, self.half_life_s), self.half_life_s)
        decision = decide_across(
            states, [r.run for r in offered], candidates, self.quotas, self.batch, recent
        )
        reasons = decision.reasons | {run_id: o.reason for run_id, o in over_budget.items()}
        for r in offered:
            if not candidates[r.run.id]:
                reasons[r.run.id] = "no declared cluster may take this run now"
        if self.preemption is not None:
            self._preempt(session, now, states, offered, decision, candidates, reasons)
        admitted = dict(decision.admit)
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
                        cluster=admitted[run_id],
                        budget_wait=None,
                    )
                )
                if session.execute(claim).rowcount:  # type: ignore[attr-defined]
                    out.append((row, admitted[run_id]))
            else:
                reason = reasons.get(run_id)
                wait = over_budget[run_id].doc() if run_id in over_budget else None
                if (reason, wait) != (row.queue_reason, row.budget_wait):
                    session.execute(
                        update(Run)
                        .where(Run.id == run_id)
                        .values(
                            queue_reason=reason,
                            budget_wait=wait,
                            # kept for the run's start-up once it leaves the queue
                            **({"queued_why": reason} if reason else {}),
                        )
                    )
        return out

    def _preempt(
        self,
        session: Session,
        now: datetime,
        states: Sequence[ClusterState],
        offered: Sequence[backlog.QueuedRow],
        decision: ClusterDecision,
        candidates: Mapping[str, Sequence[str]],
        reasons: dict[str, str],
    ) -> None:
        """Preempt for the runs left waiting for capacity (in this round's transaction, under
        the admission lock: with several replicas, one decision), each on the cluster it waits
        for first, else on another it may use: each victim is asked to stop at its next
        checkpoint within the grace; the run it makes room for says so."""
        policy = self.preemption
        if policy is None or not policy.preemptible:
            return
        lowest = min(policy.preemptible)
        runs = {r.run.id: r.run for r in offered}
        waiting = preemption.waiting(decision.order, runs, decision.reasons)
        if not any(r.priority > lowest for r in waiting):
            return
        sites = {
            state.name: preemption.Site(
                state.inventory,
                backlog.running(session, now, state.name, state.name == self.clusters.primary.name),
                held_outside(state.outside),
                state.quotas,
            )
            for state in states
            if state.inventory is not None and state.down is None
        }
        asked = [r for r in waiting if r.priority > lowest][: preemption.TRIES]
        where = {r.id: _first(decision.chosen.get(r.id), candidates[r.id]) for r in asked}
        choice = preemption.choose_across(
            waiting, sites, where, self.quotas, policy, now.timestamp()
        )
        for p in choice.preemptions:
            stopping = []
            for v in p.victims:
                row = session.get(Run, v.id, with_for_update=True)
                if row is None or row.status not in ACTIVE:
                    continue
                event = note(
                    session,
                    row,
                    f"{p.reason}: asked to stop at its next checkpoint within "
                    f"{policy.grace_s:g} s ({v.steps_lost} steps since its last save)",
                    kind="preempted",
                )
                announce.event(
                    session, row, event, "run.preempted", by=p.run.id, steps_lost=v.steps_lost
                )
                request_yield(session, row, policy.grace_s, p.reason)
                stopping.append(v.id)
            on = f" on {p.cluster}" if len(states) > 1 else ""
            reasons[p.run.id] = (
                f"preempting {', '.join(stopping)}{on} (lower priority): they stop at their "
                f"next checkpoint, within {policy.grace_s:g} s"
            )
        for run_id, ids in choice.waits_on.items():
            reasons[run_id] = f"waits for {', '.join(ids)} to stop (at a checkpoint, or in time)"
        if choice.spared:
            chosen = {p.run.id for p in choice.preemptions} | set(choice.waits_on)
            said = "; ".join(f"{i} {why}" for i, why in list(choice.spared.items())[:3])
            for run in waiting[: preemption.TRIES]:
                if run.id not in chosen and run.priority > lowest and run.id in reasons:
                    reasons[run.id] += f"; not preempted: {said}"

    def _candidates(self, row: backlog.QueuedRow) -> list[str]:
        return self.clusters.for_queued(row.run.team, row.launch, row.cluster)

    def _submit(self, queued: backlog.QueuedRow, cluster: str | None = None) -> None:
        run, launch = queued.run, queued.launch
        handle = self.clusters.of(cluster)
        ray = handle.ray
        # A team's node group is a map of the primary cluster's nodes.
        pin = self.groups.pin(run.team) if handle is self.clusters.primary else {}
        job = job_id(run.id, queued.attempt)
        runtime_env = dict(launch["runtime_env"])
        runtime_env["env_vars"] = {**runtime_env.get("env_vars", {}), **CLUSTER_EVENTS_OFF}
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
        job_samples.hook(runtime_env)  # the sample shipper, where the run keeps samples
        try:
            runtime_env["py_modules"] = [
                *runtime_env.get("py_modules", []),
                ray.package_uri(JOBS_DIR),
            ]
            if launch.get("files"):  # the run's own files: its working directory on every node
                package = zip_files(launch["files"], RUN_FILES_DIR)
                runtime_env["working_dir"] = ray.upload(package)
            fresh = ray.submit(
                submission_id=job,
                entrypoint=launch["entrypoint"],
                runtime_env=runtime_env,
                metadata={"rlrun_run_id": run.id, "rlrun_attempt": str(queued.attempt)},
                entrypoint_num_cpus=launch.get("entrypoint_num_cpus", 0.0),
                # A team mapped to a node group: its driver starts on the group's nodes.
                entrypoint_resources={
                    **(launch.get("entrypoint_resources") or {}),
                    **pin,
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
                admitted = row.submitted_at or utcnow()
                row.deadline_at = deadlines.deadline(
                    admitted, row.spec, row.team, self.team_max_duration_s
                )
            cancelled = row is not None and row.status == RunStatus.CANCELLED
        if cancelled:
            stop_job(ray, job, "cancelled while being submitted")

    def _fail(self, run_id: str, reason: str) -> None:
        with self.db.transaction() as session:
            row = session.get(Run, run_id, with_for_update=True)
            if row is not None and row.status == RunStatus.QUEUED:
                row.ray_message = reason
                transition(session, row, RunStatus.FAILED, reason)


def _first(chosen: str | None, names: Sequence[str]) -> list[str]:
    """The clusters a run may use, the one it waits for first."""
    return [chosen, *(n for n in names if n != chosen)] if chosen else list(names)

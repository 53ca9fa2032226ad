"""The queue as stored: queued and held runs read from the database for ``admission.decide``,
and the dry-run plan of a run that would join it (``plan``; ``plan_across`` over clusters)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Row, case, func, or_, select, text
from sqlalchemy.orm import Session

from service.scheduling.across import FITS_NOW, ClusterState, decide_across
from service.scheduling.admission import HeldRun, QueuedRun, Quotas
from service.scheduling.fit import on_empty_cluster
from service.scheduling.inventory import Inventory
from service.scheduling.node_groups import NodeGroups, decide_grouped
from service.scheduling.outside import ClusterJob, held_outside, unmanaged
from service.scheduling.preemption import Policy, Running, choose, waits_for_room
from service.scheduling.shape import ResourceShape
from service.settings import Settings
from service.store.models import Run, RunEvent, RunLog, utcnow
from service.store.status import ACTIVE, RunStatus

# Ray's per-node usage (``/api/cluster_status``) is refreshed about every 5 s. Until a run has
# been RUNNING this long, the service subtracts it from Ray's "available" itself (counting it
# twice at worst, which only delays admissions). Groups a recipe creates later than this are
# still covered by the service's own cluster-wide account.
SETTLE_S = 10.0
# One admission decision at a time across service replicas sharing PostgreSQL.
_ADMISSION_LOCK = 0x726C72756E


def quotas(settings: Settings) -> Quotas:
    return Quotas(dict(settings.team_quotas), settings.default_team_quota)


def preemption_policy(settings: Settings) -> Policy | None:
    """The deployment's preemption policy (None: preemption is off)."""
    if settings.preemption != "on":
        return None
    return Policy.of(
        settings.preemption_grace_s,
        settings.preemption_min_admitted_s,
        settings.preemption_max_times,
        settings.preemption_rest_s,
        settings.preemption_without_checkpoints,
        settings.preemptible_priorities,
        settings.preemption_spared_teams,
    )


def running(session: Session, now: datetime, cluster: str, primary: bool) -> list[Running]:
    """The admitted runs that have not ended on ``cluster`` (the ``primary`` holds those that
    record none), in
    admission order, as preemption sees them: whether its launch saves checkpoints, what it
    would lose now (the service's time since the save it recorded last, or since its start; and
    the steps its job logged since, told only), how often it was preempted and when last."""
    query = (
        select(
            Run.id,
            Run.team,
            Run.priority,
            Run.launch,
            Run.status,
            Run.submitted_at,
            Run.started_at,
            Run.stop_requested_at,
            Run.yield_by,
            Run.checkpoint_step,
            Run.checkpoint_at,
            Run.resumed_from_step,
            RunLog.last_step,
        )
        .outerjoin(RunLog, RunLog.run_id == Run.id)
        .where(Run.status.in_(ACTIVE))
        .order_by(Run.submitted_at, Run.id)
    )
    on = Run.cluster == cluster
    query = query.where(or_(on, Run.cluster.is_(None)) if primary else on)
    rows = session.execute(query).all()
    if not rows:
        return []
    times = {
        run_id: (n, at)
        for run_id, n, at in session.execute(
            select(RunEvent.run_id, func.count(), func.max(RunEvent.at))
            .where(RunEvent.kind == "preempted", RunEvent.run_id.in_([r.id for r in rows]))
            .group_by(RunEvent.run_id)
        )
    }
    out = []
    for r in rows:
        # Whether it saves is its launch's (a job's log line makes no run preemptible); what it
        # would lose is the service's own clock since the save it recorded (or its start).
        saves = bool(r.launch.get("checkpoints"))
        base = r.checkpoint_step if r.checkpoint_step is not None else r.resumed_from_step
        lost = max(0, (r.last_step or 0) - (base or 0))
        n, last = times.get(r.id, (0, None))
        submitted = r.submitted_at or now
        since = r.checkpoint_at or r.started_at or submitted
        out.append(
            Running(
                r.id,
                r.team,
                r.priority,
                ResourceShape.from_dict(r.launch["shape"]),
                admitted_at=submitted.timestamp(),
                started_at=r.started_at.timestamp() if r.started_at else None,
                saves=saves,
                unsaved_s=max(0.0, (now - since).total_seconds()),
                steps_lost=lost,
                times=n,
                last_preempted_at=last.timestamp() if last else None,
                stopping=r.stop_requested_at is not None or r.yield_by is not None,
                settled=r.status == RunStatus.RUNNING
                and r.started_at is not None
                and r.started_at <= now - timedelta(seconds=SETTLE_S),
            )
        )
    return out


def unclaimed(now: datetime) -> ColumnElement[bool]:
    return or_(Run.claim_expires_at.is_(None), Run.claim_expires_at < now)


def is_held(now: datetime) -> ColumnElement[bool]:
    """Active runs, and queued runs a replica has claimed and is submitting."""
    return or_(Run.status.in_(ACTIVE), (Run.status == RunStatus.QUEUED) & ~unclaimed(now))


def lock_admission(session: Session) -> bool:
    """Take the admission lock for this transaction (PostgreSQL); SQLite serialises writers."""
    if session.get_bind().dialect.name != "postgresql":
        return True
    return bool(
        session.execute(
            text("SELECT pg_try_advisory_xact_lock(:k)"), {"k": _ADMISSION_LOCK}
        ).scalar()
    )


@dataclass(frozen=True)
class QueuedRow:
    run: QueuedRun
    name: str
    launch: dict[str, Any]
    queue_reason: str | None
    over_budget_by: str | None = None
    attempt: int = 1
    resume: str | None = None  # what a later attempt resumes from
    cluster: str | None = None  # where an earlier attempt ran (or a lapsed claim was for)
    budget_wait: dict[str, Any] | None = None  # what it is told while its team is past budget


def queued(session: Session, now: datetime, claim: bool = False) -> list[QueuedRow]:
    """Queued, unclaimed runs, first in first out; a retried run's next attempt ahead of the
    rest (the head of its priority), once its backoff is over.

    With ``claim`` (the submitter's round) the rows are locked ``FOR UPDATE SKIP LOCKED`` on
    PostgreSQL: a row another transaction holds (a cancel in flight) is left for next round.
    """
    query = (
        select(
            Run.id,
            Run.name,
            Run.team,
            Run.priority,
            Run.launch,
            Run.queue_reason,
            Run.over_budget_by,
            Run.attempt,
            Run.resume,
            Run.cluster,
            Run.budget_wait,
        )
        .where(
            Run.status == RunStatus.QUEUED,
            unclaimed(now),
            or_(Run.retry_at.is_(None), Run.retry_at <= now),
        )
        .order_by(case((Run.attempt > 1, 0), else_=1), Run.id)
    )
    if claim:
        query = query.with_for_update(skip_locked=True, of=Run)
    rows = session.execute(query).all()
    return [
        QueuedRow(
            QueuedRun(r.id, r.team, r.priority, ResourceShape.from_dict(r.launch["shape"])),
            r.name,
            r.launch,
            r.queue_reason,
            r.over_budget_by,
            r.attempt,
            r.resume,
            r.cluster,
            r.budget_wait,
        )
        for r in rows
    ]


def held(session: Session, now: datetime, inventory_at: float) -> list[HeldRun]:
    """Admitted runs that have not ended, in the order they were admitted."""
    rows = session.execute(
        select(Run.id, Run.team, Run.launch, Run.status, Run.started_at)
        .where(is_held(now))
        .order_by(Run.submitted_at.is_(None), Run.submitted_at, Run.id)
    ).all()
    return [_held(r, inventory_at) for r in rows]


def _held(row: Row[Any], inventory_at: float) -> HeldRun:
    """A held run; settled once Ray's numbers read at ``inventory_at`` already show it."""
    return HeldRun(
        row.id,
        row.team,
        ResourceShape.from_dict(row.launch["shape"]),
        settled=row.status == RunStatus.RUNNING
        and row.started_at is not None
        and row.started_at.timestamp() <= inventory_at - SETTLE_S,
    )


def held_on(
    session: Session, now: datetime, inventory_at: Mapping[str, float], primary: str
) -> dict[str, list[HeldRun]]:
    """``held`` by cluster (a run that records none is on ``primary``), each judged settled
    against its own cluster's inventory time."""
    rows = session.execute(
        select(Run.id, Run.team, Run.launch, Run.status, Run.started_at, Run.cluster)
        .where(is_held(now))
        .order_by(Run.submitted_at.is_(None), Run.submitted_at, Run.id)
    ).all()
    out: dict[str, list[HeldRun]] = {name: [] for name in inventory_at}
    for r in rows:
        name = r.cluster or primary
        at = inventory_at.get(name, now.timestamp())
        out.setdefault(name, []).append(_held(r, at))
    return out


@dataclass(frozen=True)
class ClusterView:
    """What a round knows of one cluster before it opens its transaction."""

    name: str
    inventory: Inventory | None  # None: down or unreadable
    down: str | None = None
    quotas: Quotas = field(default_factory=Quotas)


def cluster_states(
    session: Session, now: datetime, views: Sequence[ClusterView], groups: NodeGroups
) -> list[ClusterState]:
    """Each cluster's state for ``decide_across``: its inventory, the runs held on it, the jobs
    outside the service there; the first is the primary (its runs may record no cluster, and
    the node groups are its)."""
    primary = views[0].name
    at = {v.name: v.inventory.fetched_at if v.inventory else now.timestamp() for v in views}
    held = held_on(session, now, at, primary)
    return [
        ClusterState(
            v.name,
            v.inventory,
            held.get(v.name, []),
            outside_jobs(session, v.inventory) if v.inventory else [],
            groups if v.name == primary else NodeGroups(),
            v.quotas,
            down=v.down,
        )
        for v in views
    ]


def node_groups(settings: Settings) -> NodeGroups:
    return NodeGroups(dict(settings.team_nodes))


def outside_jobs(session: Session, inventory: Inventory) -> list[ClusterJob]:
    """The jobs on the cluster that are no runs of the service."""
    return unmanaged(session, inventory.jobs) if inventory.jobs else []


def plan(
    session: Session,
    inventory: Inventory | None,
    candidate: QueuedRun,
    quotas: Quotas,
    now: datetime,
    groups: NodeGroups | None = None,
) -> dict[str, Any]:
    """What admission would do with ``candidate`` if it joined the queue now (a dry run)."""
    rows = queued(session, now)
    if inventory is None:
        inventory = Inventory(())
        warning = ["the cluster could not be read: feasibility was not checked"]
    else:
        warning = []
    held_runs = held(session, now, inventory.fetched_at)
    groups = groups or NodeGroups()
    outside = outside_jobs(session, inventory)
    queue = [*(r.run for r in rows), candidate]
    decision = decide_grouped(groups, queue, held_runs, inventory, quotas, outside=outside)
    # A team mapped to a node group plans on that group's nodes only.
    mine = groups.view(inventory, candidate.team)
    ever = on_empty_cluster(mine).fit(candidate.shape) if inventory.nodes else None
    placement = decision.placements.get(candidate.id) or ever
    reason = decision.reasons.get(candidate.id)
    return {
        "feasible_ever": ever is not None if inventory.nodes else None,
        "feasible_now": candidate.id in decision.admit,
        "placement": placement.as_list() if placement else [],
        "totals": {
            "cluster": {r: mine.sum(r) for r in ("NPU", "GPU", "CPU", "memory")},
            "run": candidate.shape.as_dict(),
        },
        "queue_position": decision.order.index(candidate.id),
        "reasons": [reason] if reason and inventory.nodes else [],
        "warnings": warning,
        "node_group": groups.group_of(candidate.team) if groups else None,
    }


def plan_preemption(
    session: Session,
    inventory: Inventory | None,
    candidate: QueuedRun,
    plan: dict[str, Any],
    quotas: Quotas,
    policy: Policy,
    launch: Any,
    cluster: str,
) -> dict[str, Any]:
    """What preemption would do about ``candidate`` (a dry run on one cluster): ``preemption``,
    what would happen to it if a higher run needed its room ("saves no checkpoints: never
    preempted"), and ``preempts``, the runs it would preempt now, each with the steps it would
    lose if its grace ran out at once."""
    out: dict[str, Any] = {
        "preemption": policy.at_submit(
            candidate.priority, bool(launch.checkpoints), candidate.team
        ),
        "preempts": [],
    }
    reasons = {candidate.id: plan["reasons"][0]} if plan.get("reasons") else {}
    if inventory is None or plan.get("feasible_now") or not waits_for_room(candidate, reasons):
        return out
    now = utcnow()
    outside = held_outside(outside_jobs(session, inventory))
    held_runs = running(session, now, cluster, primary=True)
    choice = choose([candidate], held_runs, inventory, quotas, policy, now.timestamp(), outside)
    out["preempts"] = [v.as_dict() for p in choice.preemptions for v in p.victims]
    if not out["preempts"] and choice.spared:
        out["spared"] = dict(choice.spared)
    return out


def plan_across(
    clusters: Sequence[ClusterState],
    queue: Sequence[QueuedRun],
    candidates: Mapping[str, Sequence[str]],
    candidate: QueuedRun,
    quotas: Quotas,
) -> dict[str, Any]:
    """What admission across ``clusters`` would do with ``candidate`` if it joined ``queue``
    now (a dry run): ``plan``'s answer for the cluster chosen, plus ``cluster`` (the one it would
    be admitted to or wait for, None when none), ``why`` that one, and ``clusters``: for every
    cluster, whether the run may go there, fits there ever and now, and that cluster's reason.

    The caller reads what ``decide_across`` is given in the submitter's round: the queue
    (``queued(session, now)``), each cluster's state (its inventory, the runs held on it, the
    jobs outside the service) and ``candidates`` for every queued run and for ``candidate``."""
    decision = decide_across(clusters, [*queue, candidate], candidates, quotas)
    run_id = candidate.id
    where = list(candidates.get(run_id, ()))
    chosen = decision.chosen.get(run_id)
    by_name = {c.name: c for c in clusters}
    reasons = decision.by_cluster.get(run_id, {})
    per_cluster = []
    ever_anywhere: bool | None = False
    for state in clusters:
        known = state.inventory if state.inventory and state.inventory.nodes else None
        mine = state.groups.view(known, candidate.team) if known else None
        ever = on_empty_cluster(mine).fit(candidate.shape) is not None if mine else None
        if state.name in where and ever:
            ever_anywhere = True
        elif state.name in where and ever is None and ever_anywhere is False:
            ever_anywhere = None  # a cluster it may use could not be read
        per_cluster.append(
            {
                "name": state.name,
                "candidate": state.name in where,
                "down": state.down,
                "feasible_ever": ever,
                # Fits there now, whether or not it is the cluster chosen.
                "feasible_now": reasons.get(state.name) == FITS_NOW,
                "reason": reasons.get(state.name, "not a cluster this run may use"),
            }
        )
    # The cluster chosen; if none, the first it may use.
    target = by_name.get(chosen or next((n for n in where if n in by_name), ""))
    inventory = target.inventory if target and target.inventory else Inventory(())
    mine = target.groups.view(inventory, candidate.team) if target else inventory
    ever_here = on_empty_cluster(mine).fit(candidate.shape) if mine.nodes else None
    placement = decision.placements.get(run_id) or ever_here
    reason = decision.reasons.get(run_id)
    unread = [c.name for c in clusters if c.name in where and c.inventory is None]
    return {
        "cluster": chosen,
        "why": decision.why.get(run_id),
        "clusters": per_cluster,
        "feasible_ever": ever_anywhere,
        "feasible_now": run_id in dict(decision.admit),
        "placement": placement.as_list() if placement else [],
        "totals": {
            "cluster": {r: mine.sum(r) for r in ("NPU", "GPU", "CPU", "memory")},
            "run": candidate.shape.as_dict(),
        },
        "queue_position": decision.order.index(run_id),
        "reasons": [reason] if reason else [],
        "warnings": [f"cluster {n} could not be read: its fit was not checked" for n in unread],
        "node_group": target.groups.group_of(candidate.team) if target and target.groups else None,
    }

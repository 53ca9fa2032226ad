"""The queue as stored: queued and held runs read from the database for ``admission.decide``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, case, or_, select, text
from sqlalchemy.orm import Session

from service.scheduling.admission import HeldRun, QueuedRun, Quotas
from service.scheduling.fit import on_empty_cluster
from service.scheduling.inventory import Inventory
from service.scheduling.node_groups import NodeGroups, decide_grouped
from service.scheduling.outside import ClusterJob, unmanaged
from service.scheduling.shape import ResourceShape
from service.settings import Settings
from service.store.models import Run
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
    return [
        HeldRun(
            r.id,
            r.team,
            ResourceShape.from_dict(r.launch["shape"]),
            settled=r.status == RunStatus.RUNNING
            and r.started_at is not None
            and r.started_at.timestamp() <= inventory_at - SETTLE_S,
        )
        for r in rows
    ]


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
        out.setdefault(name, []).append(
            HeldRun(
                r.id,
                r.team,
                ResourceShape.from_dict(r.launch["shape"]),
                settled=r.status == RunStatus.RUNNING
                and r.started_at is not None
                and r.started_at.timestamp() <= at - SETTLE_S,
            )
        )
    return out


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

"""The primary cluster as the service sees it: nodes (with who holds what) and the jobs outside
the service; with them what each active run holds (on any cluster, each named), teams against
their quotas and fair-share standing (``turn`` 1 is served first within a priority class) and
the queue in admission's order. Nothing is decided here; another team's run
names are hidden from a non-admin (``clusters_view``: every cluster)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from service import usage
from service.operations.parts import Parts
from service.principal import Principal
from service.scheduling import backlog
from service.scheduling.admission import held_by_team, queue_order, standings
from service.scheduling.fair_share import recent_accelerators
from service.scheduling.inventory import Inventory
from service.scheduling.node_groups import NodeGroups
from service.scheduling.outside import holders, unmanaged
from service.scheduling.priority import PRIORITY_NAMES
from service.store.models import Run, utcnow


def cluster_view(parts: Parts, principal: Principal, limit: int | None) -> dict[str, Any]:
    """A ``ClusterOut``: ``active``, ``queue`` and ``unmanaged`` cut at ``limit`` rows (at most
    the configured bound), ``truncated`` says when. The inventory (a Ray call) is read before
    the one read transaction."""
    bound = min(limit or parts.settings.cluster_list_limit, parts.settings.cluster_list_limit)

    def name(team: str, value: str) -> str | None:
        return value if principal.sees(team) else None

    inventory = parts.cluster()
    now = utcnow()
    quotas = backlog.quotas(parts.settings)
    groups = backlog.node_groups(parts.settings)
    with parts.db.read() as session:
        rows = backlog.queued(session, now)
        held = backlog.held(session, now, inventory.fetched_at if inventory else now.timestamp())
        active = session.execute(
            select(Run.id, Run.name, Run.team, Run.status, Run.priority, Run.launch, Run.cluster)
            .where(backlog.is_held(now))
            .order_by(Run.id)
        ).all()
        half_life = parts.settings.fair_share_half_life_s
        recent = recent_accelerators(usage.recent(session, now, half_life), half_life)
        foreign = unmanaged(session, inventory.jobs) if inventory else []
        held_on = holders(session, inventory.jobs, foreign) if inventory else {}
    by_id = {r.run.id: r for r in rows}
    known = inventory or Inventory(())
    order = queue_order([r.run for r in rows], held, known, quotas, recent)
    used = held_by_team(held)
    standing = standings([r.run.team for r in rows], held, known, quotas, recent)
    teams = {
        team: {
            "accelerators": used.get(team, 0),
            "quota": quotas.of(team),
            "recent": s.as_dict()["recent"],
            "standing": s.as_dict()["standing"],
            "turn": turn,
        }
        for turn, (team, s) in enumerate(standing.items(), 1)
    }
    local = parts.clusters.primary.local
    return {
        "job_user": local.user.name if local is not None and local.user is not None else None,
        "jobs_act_as_service": local is not None and local.user is None,
        "truncated": len(active) > bound or len(order) > bound or len(foreign) > bound,
        "ray": {"ok": inventory is not None},
        "nodes": _nodes(inventory, groups, held_on, principal) if inventory else [],
        "active": [
            {
                "id": r.id,
                "name": name(r.team, r.name),
                "team": r.team,
                "status": r.status,
                "priority": PRIORITY_NAMES.get(r.priority, str(r.priority)),
                "accelerators": r.launch["shape"]["accelerators"],
                "shape": r.launch["shape"],
                "cluster": r.cluster,
            }
            for r in active[:bound]
        ],
        "teams": teams,
        "queue": [
            {
                "position": position,
                "id": run.id,
                "name": name(run.team, by_id[run.id].name),
                "team": run.team,
                "priority": PRIORITY_NAMES.get(run.priority, str(run.priority)),
                "accelerators": run.shape.accelerators,
                "reason": by_id[run.id].queue_reason,
            }
            for position, run in enumerate(order[:bound])
        ],
        "unmanaged": [
            j.as_dict() | {"entrypoint": j.entrypoint if principal.role == "admin" else None}
            for j in foreign[:bound]
        ],
        "team_nodes": dict(groups.teams),
    }


def _nodes(
    inventory: Inventory,
    groups: NodeGroups,
    held_on: dict[str, list[dict[str, Any]]],
    principal: Principal,
) -> list[dict[str, Any]]:
    """Each node with its address, its node group and who holds what on it (Ray's report)."""
    return [
        n.as_dict()
        | inventory.addresses.get(n.id, {})
        | {
            "group": groups.group_of_node(inventory, n.id),
            "holders": [
                x | {"name": x["name"] if x["team"] and principal.sees(x["team"]) else None}
                for x in held_on.get(n.id, [])
            ],
        }
        for n in inventory.nodes
    ]

"""``GET /cluster``: nodes, what each active run holds, teams against quotas, the queue in order."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from sqlalchemy import select

from service.api.auth import Viewer
from service.api.deps import ServicesDep
from service.scheduling import backlog
from service.scheduling.admission import PRIORITY_NAMES, decide, held_by_team
from service.scheduling.inventory import Inventory
from service.store.models import Run, utcnow

router = APIRouter(tags=["cluster"])


@router.get("/cluster")
def get_cluster(
    services: ServicesDep,
    principal: Viewer,
    limit: Annotated[
        int | None, Query(ge=1, le=100_000, description="rows of active and queue at most")
    ] = None,
) -> dict[str, Any]:
    """The queue order and reasons are admission's own decision on the current inventory.
    Another team's runs show without their names to a non-admin; ``active`` and ``queue`` are
    cut at ``limit`` rows (at most the configured bound), ``truncated`` says when."""
    bound = min(limit or services.settings.cluster_list_limit, services.settings.cluster_list_limit)

    def name(team: str, value: str) -> str | None:
        return value if principal.sees(team) else None

    inventory = services.cluster()
    now = utcnow()
    quotas = backlog.quotas(services.settings)
    with services.db.read() as session:
        rows = backlog.queued(session, now)
        held = backlog.held(session, now, inventory.fetched_at if inventory else now.timestamp())
        active = session.execute(
            select(Run.id, Run.name, Run.team, Run.status, Run.priority, Run.launch)
            .where(backlog.is_held(now))
            .order_by(Run.id)
        ).all()
    decision = decide([r.run for r in rows], held, inventory or Inventory(()), quotas)
    by_id = {r.run.id: r for r in rows}
    teams = {
        team: {"accelerators": used, "quota": quotas.of(team)}
        for team, used in sorted(held_by_team(held).items())
    }
    queue_ids = decision.order[:bound]
    return {
        "truncated": len(active) > bound or len(decision.order) > bound,
        "ray": {"ok": inventory is not None},
        "nodes": [n.as_dict() for n in inventory.nodes] if inventory else [],
        "active": [
            {
                "id": r.id,
                "name": name(r.team, r.name),
                "team": r.team,
                "status": r.status,
                "priority": PRIORITY_NAMES.get(r.priority, str(r.priority)),
                "accelerators": r.launch["shape"]["accelerators"],
                "shape": r.launch["shape"],
            }
            for r in active[:bound]
        ],
        "teams": teams,
        "queue": [
            {
                "position": position,
                "id": run_id,
                "name": name(by_id[run_id].run.team, by_id[run_id].name),
                "team": by_id[run_id].run.team,
                "priority": PRIORITY_NAMES.get(by_id[run_id].run.priority, "normal"),
                "accelerators": by_id[run_id].run.shape.accelerators,
                "reason": (
                    decision.reasons.get(run_id, "admitted in the next round")
                    if inventory
                    else by_id[run_id].queue_reason
                ),
            }
            for position, run_id in enumerate(queue_ids)
        ],
    }

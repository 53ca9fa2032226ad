"""Every cluster as the service sees it: what it is (accelerator, labels, teams, verl versions,
image, roots), whether it is up and since when, its capacity (total and free per accelerator,
from its cached inventory) and the service's runs on it. Its address is an admin's to see."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select

from service.operations.parts import Parts
from service.principal import Principal
from service.store.models import Run
from service.store.status import ACTIVE

ACCELERATORS = ("NPU", "GPU")


def clusters_view(parts: Parts, principal: Principal) -> dict[str, Any]:
    """A ``ClustersOut``. The inventories (a Ray call each, cached) are read before the one
    read transaction; a cluster that is down is not asked."""
    inventories = {h.name: parts.cluster(h.name) for h in parts.clusters}
    primary = parts.clusters.primary.name
    with parts.db.read() as session:
        counts = session.execute(
            select(Run.cluster, func.count()).where(Run.status.in_(ACTIVE)).group_by(Run.cluster)
        ).all()
    active: dict[str, int] = {}
    for name, n in counts:
        active[name or primary] = active.get(name or primary, 0) + n
    admin = principal.role == "admin"
    out = []
    for handle in parts.clusters:
        spec, health, inventory = handle.spec, handle.health, inventories[handle.name]
        capacity = None
        if inventory is not None:
            capacity = {
                r: {
                    "total": sum(n.total.get(r, 0.0) for n in inventory.nodes),
                    "free": sum(n.available.get(r, 0.0) for n in inventory.nodes),
                }
                for r in ACCELERATORS
                if any(r in n.total for n in inventory.nodes)
            }
        out.append(
            {
                "name": spec.name,
                "accelerator": spec.accelerator,
                "labels": spec.labels,
                "teams": spec.teams,
                "quotas": spec.quotas,
                "usable": principal.team is None or admin or spec.admits_team(principal.team),
                "verl_versions": spec.verl_versions,
                "image": spec.image,
                "data_roots": spec.data_roots,
                "checkpoint_root": spec.checkpoint_root,
                "local": spec.local is not None,
                "address": handle.ray.address if admin else None,
                "health": {
                    "up": health.up,
                    "since": health.since,
                    "failing_since": health.failing_since,
                    "error": health.error if admin else None,
                },
                "readable": inventory is not None,
                "nodes": len(inventory.nodes) if inventory is not None else None,
                "capacity": capacity,
                "active_runs": active.get(spec.name, 0),
            }
        )
    return {"clusters": out}

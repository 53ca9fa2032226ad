"""Which queued runs may go to Ray now: gang admission against the cluster's accelerators.

Runs are taken in queue order (priority, then FIFO). A run is admitted only when its whole
shape fits in what the cluster has minus what the service already admitted (Ray's own
"available" lags, so the service counts what it sent until those runs end).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from service.recipes.base import ResourceShape


@dataclass(frozen=True)
class Inventory:
    """Cluster totals per resource name (e.g. ``{"NPU": 16, "CPU": 32}``) and per node."""

    totals: dict[str, float]
    nodes: dict[str, dict[str, float]] = field(default_factory=dict)

    @classmethod
    def from_cluster_status(cls, status: dict[str, Any]) -> Inventory:
        usage = status["data"]["clusterStatus"]["loadMetricsReport"]["usageByNode"]
        nodes = {
            node: {res: float(pair[1]) for res, pair in resources.items()}
            for node, resources in usage.items()
        }
        totals: dict[str, float] = {}
        for resources in nodes.values():
            for res, amount in resources.items():
                totals[res] = totals.get(res, 0.0) + amount
        return cls(totals=totals, nodes=nodes)


def demand(shape: ResourceShape) -> dict[str, float]:
    need = {"CPU": shape.driver_cpus, shape.accelerator: 0.0}
    for g in shape.groups:
        need[shape.accelerator] += g.accelerators
        need["CPU"] += g.cpus
    return need


def admit(
    queued: Sequence[tuple[str, ResourceShape]],
    held: Iterable[ResourceShape],
    inventory: Inventory,
) -> list[str]:
    """Ids of queued runs (already in queue order) to submit now, strictly in order."""
    free = dict(inventory.totals)
    for shape in held:
        _take(free, demand(shape))
    chosen: list[str] = []
    for run_id, shape in queued:
        need = demand(shape)
        if any(free.get(res, 0.0) < amount for res, amount in need.items()):
            break
        _take(free, need)
        chosen.append(run_id)
    return chosen


def _take(free: dict[str, float], need: dict[str, float]) -> None:
    for res, amount in need.items():
        free[res] = free.get(res, 0.0) - amount

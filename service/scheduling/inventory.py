"""The cluster's nodes with total and available resources, and the jobs on it with what they
hold (``outside``), as scheduling decides with them: handed in, read from Ray and cached by
``cluster/inventory_cache.py``."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from service.scheduling.outside import ClusterJob

# Resources shown and planned with; Ray also reports per-node labels such as "node:<ip>".
SHOWN = ("NPU", "GPU", "CPU", "memory")


@dataclass(frozen=True)
class Node:
    id: str
    total: dict[str, float]
    available: dict[str, float]
    # The node's other resources by name (custom ones, such as a node group's; see node_groups).
    custom: frozenset[str] = frozenset()

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "total": self.total, "available": self.available}


@dataclass(frozen=True)
class Inventory:
    nodes: tuple[Node, ...]
    fetched_at: float = field(default_factory=time.time)
    # Every alive job on the cluster, the service's runs among them (see ``outside.unmanaged``).
    jobs: tuple[ClusterJob, ...] = ()
    # Node id -> {"address": its IP, "hostname": ...} as Ray lists its nodes.
    addresses: dict[str, dict[str, str]] = field(default_factory=dict)

    @classmethod
    def from_cluster_status(cls, status: dict[str, Any]) -> Inventory:
        """From ``GET /api/cluster_status``: usageByNode maps node -> resource -> [used, total]."""
        usage = status["data"]["clusterStatus"]["loadMetricsReport"]["usageByNode"]
        nodes = []
        for node_id, resources in sorted(usage.items()):
            total = {r: float(p[1]) for r, p in resources.items() if r in SHOWN}
            available = {
                r: max(0.0, float(p[1]) - float(p[0])) for r, p in resources.items() if r in SHOWN
            }
            custom = frozenset(r for r in resources if r not in SHOWN)
            nodes.append(Node(node_id, total, available, custom))
        return cls(tuple(nodes))

    def totals(self) -> dict[str, dict[str, float]]:
        return {n.id: n.total for n in self.nodes}

    def available(self) -> dict[str, dict[str, float]]:
        return {n.id: n.available for n in self.nodes}

    def sum(self, resource: str) -> float:
        return sum(n.total.get(resource, 0.0) for n in self.nodes)

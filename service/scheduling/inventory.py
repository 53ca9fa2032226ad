"""The cluster's nodes with total and available resources, and the jobs on it with what they
hold (``outside``), read from Ray and cached briefly."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any

from service.cluster.ray_jobs import RayJobs, RayRejected, RayUnavailable
from service.scheduling import outside
from service.scheduling.outside import ClusterJob

log = logging.getLogger(__name__)

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


class InventoryCache:
    """One inventory shared by the API and the loops, re-read from Ray when older than ``ttl_s``.

    Calls block on Ray (with the client's timeout): use them from threads, never the event loop.
    """

    def __init__(self, ray: RayJobs, ttl_s: float) -> None:
        self.ray = ray
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._value: Inventory | None = None
        # The jobs are re-read at most every ``ttl_s`` (three calls), however fresh the nodes.
        self._jobs: tuple[ClusterJob, ...] = ()
        self._addresses: dict[str, dict[str, str]] = {}
        self._jobs_at = float("-inf")
        self._jobs_failing = False
        # A failed read is remembered as long, so a Ray outage does not stall every caller.
        self._failure: tuple[float, RayUnavailable | RayRejected] | None = None

    def get(self, max_age_s: float | None = None) -> Inventory:
        """The cached inventory, refreshed first if older than ``max_age_s`` (default ttl).

        The jobs on the cluster are re-read at most every ``ttl_s``, by the one caller that
        finds them due, outside the lock: the others go on with the jobs known last."""
        limit = self.ttl_s if max_age_s is None else max_age_s
        with self._lock:
            now = time.time()
            if self._value is not None and now - self._value.fetched_at <= limit:
                return self._value
            if self._failure is not None and now - self._failure[0] <= limit:
                raise self._failure[1]
            try:
                value = Inventory.from_cluster_status(self.ray.cluster_status())
            except (RayUnavailable, RayRejected) as exc:
                self._failure = (now, exc)
                raise
            self._failure = None
            self._value = replace(value, jobs=self._jobs, addresses=self._addresses)
            due = now - self._jobs_at > self.ttl_s
            if not due:
                return self._value
            self._jobs_at = now
        try:
            jobs, addresses = tuple(outside.read(self.ray)), outside.addresses(self.ray)
        except (RayUnavailable, RayRejected, KeyError, TypeError, ValueError) as exc:
            # The nodes are still good; the jobs known last stand until the next read. Said
            # once per run of failures, not every ``ttl_s``.
            (log.debug if self._jobs_failing else log.warning)(
                "reading the jobs on the cluster failed (the last known stand): %r", exc
            )
            self._jobs_failing = True
            return value if self._value is None else self._value
        with self._lock:
            self._jobs_failing = False
            self._jobs, self._addresses = jobs, addresses
            if self._value is not None:
                self._value = replace(self._value, jobs=jobs, addresses=addresses)
            return replace(value, jobs=jobs, addresses=addresses)

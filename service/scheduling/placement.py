"""Packing a run's resource shape onto nodes: each group on one node, driver CPUs anywhere.

A pool is the free resources per node. ``pack`` finds a node for every group of a shape (best
fit, largest groups first, then a bounded search over distinct node states), so a shape that
fits is found even when greedy packing would strand a group. The driver-side CPUs of a shape
are many small actors, so they may be split over any nodes: only their sum has to fit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from service.scheduling.shape import ResourceShape

EPS = 1e-9
# Search steps before giving up on a shape (counted as "does not fit"; greedy is tried first).
SEARCH_BUDGET = 5_000


@dataclass
class Pool:
    """Free resources per node (resource name -> amount), in a fixed node order."""

    node_ids: list[str]
    free: list[dict[str, float]]

    @classmethod
    def of(cls, nodes: dict[str, dict[str, float]]) -> Pool:
        return cls(list(nodes), [dict(r) for r in nodes.values()])

    def copy(self) -> Pool:
        return Pool(list(self.node_ids), [dict(r) for r in self.free])

    def ordered(self, keys: Sequence[float]) -> Pool:
        """The same nodes sorted by ``keys`` (one per node, ascending; ties keep their order)."""
        order = sorted(range(len(self.free)), key=lambda i: keys[i])
        return Pool([self.node_ids[i] for i in order], [dict(self.free[i]) for i in order])

    def largest(self, resource: str) -> float:
        return max((r.get(resource, 0.0) for r in self.free), default=0.0)

    def take(self, placement: Placement) -> None:
        """Subtract a placement (never below zero: a pool may be a conservative estimate)."""
        index = {node: i for i, node in enumerate(self.node_ids)}
        for slot in placement.slots:
            if slot.node not in index:
                continue
            res = self.free[index[slot.node]]
            for name, amount in ((placement.accelerator, slot.accelerators), ("CPU", slot.cpus)):
                res[name] = max(0.0, res.get(name, 0.0) - amount)


@dataclass(frozen=True)
class Slot:
    """Where one group (or a share of the driver CPUs, ``role="driver"``) goes."""

    role: str
    node: str
    accelerators: int
    cpus: float


@dataclass(frozen=True)
class Placement:
    accelerator: str
    slots: tuple[Slot, ...] = field(default_factory=tuple)

    def as_list(self) -> list[dict[str, Any]]:
        return [s.__dict__ for s in self.slots]


def pack(shape: ResourceShape, pool: Pool) -> Placement | None:
    """A placement of ``shape`` on ``pool``'s free resources, or None when it does not fit."""
    acc = shape.accelerator
    groups = shape.groups
    free = [(r.get(acc, 0.0), r.get("CPU", 0.0)) for r in pool.free]
    need_acc = sum(g.accelerators for g in groups)
    need_cpu = sum(g.cpus for g in groups) + shape.driver_cpus
    if need_acc > sum(a for a, _ in free) + EPS or need_cpu > sum(c for _, c in free) + EPS:
        return None
    order = sorted(range(len(groups)), key=lambda i: (-groups[i].accelerators, -groups[i].cpus))
    nodes = _search([(groups[i].accelerators, groups[i].cpus) for i in order], free)
    if nodes is None:
        return None
    left = list(free)
    slots = []
    for i, node in zip(order, nodes, strict=True):
        g = groups[i]
        slots.append(Slot(g.role, pool.node_ids[node], g.accelerators, g.cpus))
        a, c = left[node]
        left[node] = (a - g.accelerators, c - g.cpus)
    for node, cpus in _spread_driver(shape.driver_cpus, [c for _, c in left]):
        slots.append(Slot("driver", pool.node_ids[node], 0, cpus))
    return Placement(acc, tuple(slots))


def _search(
    groups: Sequence[tuple[int, float]], free: list[tuple[float, float]]
) -> list[int] | None:
    """Node index per group (groups sorted largest first): best fit first, then backtracking."""
    left = list(free)
    chosen: list[int] = []
    steps = 0

    def fits(node: int, g: tuple[int, float]) -> bool:
        a, c = left[node]
        return a + EPS >= g[0] and c + EPS >= g[1]

    def visit(k: int) -> bool:
        nonlocal steps
        if k == len(groups):
            return True
        g = groups[k]
        tried: set[tuple[float, float]] = set()
        # Identical consecutive groups take nodes in non-decreasing order (no symmetric retries).
        start = chosen[-1] if k and groups[k - 1] == g else 0
        candidates = [n for n in range(start, len(left)) if fits(n, g)]
        candidates.sort(key=lambda n: (left[n][0] - g[0], left[n][1] - g[1]))
        for node in candidates:
            if left[node] in tried:
                continue
            tried.add(left[node])
            steps += 1
            if steps > SEARCH_BUDGET:
                return False
            a, c = left[node]
            left[node] = (a - g[0], c - g[1])
            chosen.append(node)
            if visit(k + 1):
                return True
            chosen.pop()
            left[node] = (a, c)
        return False

    return chosen if visit(0) else None


def _spread_driver(cpus: float, free_cpus: list[float]) -> list[tuple[int, float]]:
    """Driver CPUs on the nodes with the most CPUs left (the caller checked that the sum fits)."""
    slots = []
    remaining = cpus
    for node in sorted(range(len(free_cpus)), key=lambda n: -free_cpus[n]):
        if remaining <= EPS:
            break
        share = min(remaining, free_cpus[node])
        if share > EPS:
            slots.append((node, share))
            remaining -= share
    return slots


class Fitter:
    """``pack`` on a pool that only shrinks, remembering answers until the pool next changes.

    A shape that did not fit never fits later; one that fitted fits again until ``take``.
    """

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self._misses: set[ResourceShape] = set()
        self._hits: dict[ResourceShape, Placement] = {}

    def fit(self, shape: ResourceShape) -> Placement | None:
        if shape in self._misses:
            return None
        if shape not in self._hits:
            placed = pack(shape, self.pool)
            if placed is None:
                self._misses.add(shape)
                return None
            self._hits[shape] = placed
        return self._hits[shape]

    def take(self, placement: Placement) -> None:
        self.pool.take(placement)
        self._hits.clear()

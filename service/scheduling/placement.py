"""Packing a run's resource shape onto nodes: each group on one node, driver CPUs anywhere.

A pool is the free resources per node. ``pack`` finds a node for every group of a shape (best
fit, largest groups first, then a bounded search over distinct node states), so a shape that
fits is found even when greedy packing would strand a group. The driver-side CPUs of a shape
are many small actors, so they may be split over any nodes: only their sum has to fit.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
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
    # Per accelerator: (free accelerators, free CPUs) per node and their sums, until a take.
    _pairs: dict[str, tuple[list[tuple[float, float]], float, float]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    _index: dict[str, int] | None = field(default=None, init=False, repr=False, compare=False)
    # Free CPUs per node; and per (accelerator, accelerators, CPUs) the nodes that hold as much.
    _cpus: list[float] | None = field(default=None, init=False, repr=False, compare=False)
    _holding: dict[tuple[str, float, float], list[int]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

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

    def pairs(self, accelerator: str) -> tuple[list[tuple[float, float]], float, float]:
        """(free ``accelerator``, free CPUs) per node, and the sum of each: what ``pack`` asks
        of the pool, worked out once per accelerator until the next ``take``."""
        known = self._pairs.get(accelerator)
        if known is None:
            pairs = [(r.get(accelerator, 0.0), r.get("CPU", 0.0)) for r in self.free]
            known = (pairs, sum(a for a, _ in pairs), sum(c for _, c in pairs))
            self._pairs[accelerator] = known
        return known

    def at(self, node: str) -> dict[str, float]:
        """What is free on ``node`` (a node of this pool)."""
        index = self._index
        if index is None:
            index = self._index = {n: i for i, n in enumerate(self.node_ids)}
        return self.free[index[node]]

    def cpus(self) -> list[float]:
        """Free CPUs per node (kept up to date by ``take``; not to be changed by the caller)."""
        if self._cpus is None:
            self._cpus = [r.get("CPU", 0.0) for r in self.free]
        return self._cpus

    def holding(self, accelerator: str, accelerators: float, cpus: float) -> list[int]:
        """The nodes (in order) with at least ``accelerators`` and ``cpus`` free; kept up to
        date by ``take`` (a node only loses what is free there)."""
        key = (accelerator, accelerators, cpus)
        known = self._holding.get(key)
        if known is None:
            pairs = self.pairs(accelerator)[0]
            known = [
                i for i, (a, c) in enumerate(pairs) if a + EPS >= accelerators and c + EPS >= cpus
            ]
            self._holding[key] = known
        return known

    def take(self, placement: Placement) -> None:
        """Subtract a placement (never below zero: a pool may be a conservative estimate)."""
        index = self._index
        if index is None:
            index = self._index = {node: i for i, node in enumerate(self.node_ids)}
        touched = set()
        for slot in placement.slots:
            i = index.get(slot.node)
            if i is None:
                continue
            res = self.free[i]
            for name, amount in ((placement.accelerator, slot.accelerators), ("CPU", slot.cpus)):
                res[name] = max(0.0, res.get(name, 0.0) - amount)
            touched.add(i)
        # The pairs known are brought up to date on the nodes taken from, not worked out anew.
        for acc, (pairs, free_acc, free_cpu) in list(self._pairs.items()):
            for i in touched:
                a, c = pairs[i]
                pairs[i] = new = (self.free[i].get(acc, 0.0), self.free[i].get("CPU", 0.0))
                free_acc, free_cpu = free_acc - a + new[0], free_cpu - c + new[1]
            self._pairs[acc] = (pairs, free_acc, free_cpu)
        if self._cpus is not None:
            for i in touched:
                self._cpus[i] = self.free[i].get("CPU", 0.0)
        for (acc, least_a, least_c), nodes in self._holding.items():
            for i in touched:
                res = self.free[i]
                holds = res.get(acc, 0.0) + EPS >= least_a and res.get("CPU", 0.0) + EPS >= least_c
                if not holds and i in nodes:
                    nodes.remove(i)


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
    free, free_acc, free_cpu = pool.pairs(acc)
    need_acc = sum(g.accelerators for g in groups)
    need_cpu = sum(g.cpus for g in groups) + shape.driver_cpus
    if need_acc > free_acc + EPS or need_cpu > free_cpu + EPS:
        return None
    order = sorted(range(len(groups)), key=lambda i: (-groups[i].accelerators, -groups[i].cpus))
    nodes: list[int] | None = []
    if groups:
        # A node too small for the smallest group holds none: the search looks at the others
        # only (on a busy cluster, most nodes are such), which changes no answer.
        least_a = min(g.accelerators for g in groups)
        least_c = min(g.cpus for g in groups)
        useful = pool.holding(acc, least_a, least_c)
        found = _search(
            [(groups[i].accelerators, groups[i].cpus) for i in order], [free[n] for n in useful]
        )
        nodes = None if found is None else [useful[n] for n in found]
    if nodes is None:
        return None
    left = list(pool.cpus())
    slots = []
    for i, node in zip(order, nodes, strict=True):
        g = groups[i]
        slots.append(Slot(g.role, pool.node_ids[node], g.accelerators, g.cpus))
        left[node] = left[node] - g.cpus
    for node, cpus in _spread_driver(shape.driver_cpus, left):
        slots.append(Slot("driver", pool.node_ids[node], 0, cpus))
    return Placement(acc, tuple(slots))


def _search(
    groups: Sequence[tuple[int, float]], free: list[tuple[float, float]]
) -> list[int] | None:
    """Node index per group (groups sorted largest first): best fit first, then backtracking."""
    left = list(free)
    chosen: list[int] = []
    steps = 0

    def visit(k: int) -> bool:
        nonlocal steps
        if k == len(groups):
            return True
        g = groups[k]
        # Identical consecutive groups take nodes in non-decreasing order (no symmetric retries).
        start = chosen[-1] if k and groups[k - 1] == g else 0
        # Nodes in the same state are interchangeable: only the first of each is tried, best
        # fit first (ties in node order, as a stable sort of every node would give). Each
        # state's first node is found without a step per node: walking backwards, the first
        # is the last written.
        first = dict(zip(reversed(left[start:]), range(len(left) - 1, start - 1, -1), strict=True))
        fitting = [
            (a - g[0], c - g[1], n)
            for (a, c), n in first.items()
            if a + EPS >= g[0] and c + EPS >= g[1]
        ]
        for *_, node in sorted(fitting):
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
    if cpus <= EPS:
        return []
    # Most often the node with the most CPUs left holds them all: the first such node, as the
    # stable sort below would put first.
    largest = max(free_cpus)
    if largest >= cpus:
        return [(free_cpus.index(largest), cpus)]
    slots = []
    remaining = cpus
    for node in sorted(range(len(free_cpus)), key=free_cpus.__getitem__, reverse=True):
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
        self._misses: set[Hashable] = set()
        self._hits: dict[Hashable, Placement] = {}

    def fit(self, shape: ResourceShape, key: Hashable | None = None) -> Placement | None:
        """``pack(shape, pool)``, remembered under ``key`` (default: the shape itself; a caller
        that asks for many equal shapes may name them by a cheaper key, one per shape)."""
        k = shape if key is None else key
        if k in self._misses:
            return None
        placed = self._hits.get(k)
        if placed is None:
            placed = pack(shape, self.pool)
            if placed is None:
                self._misses.add(k)
                return None
            self._hits[k] = placed
        return placed

    def take(self, placement: Placement) -> None:
        self.pool.take(placement)
        self._hits.clear()

"""Which queued runs go to Ray now, in what order the rest wait, and why each one waits.

- **Gang admission.** A run is admitted only when all of its groups pack onto the nodes at
  once. The free resources per node are what Ray reports available (so usage outside the
  service counts too) minus the runs admitted recently enough that Ray may not show them yet
  ("unsettled"; Ray's "available" lags). On top, the service's own account must agree: the
  cluster's totals minus everything admitted and not yet ended and minus what jobs outside the
  service hold (``outside``), whatever Ray says.
- **Order.** Priority class first (high, normal, low); within a class, teams take turns by how
  far below their share they are (accelerators held, plus those of runs already ahead in the
  queue, divided by the team's quota or, without one, the cluster's accelerators); each team's
  own runs stay first in, first out.
- **Quotas.** A team's accelerators held by active and admitted runs never exceed its quota; a
  run that would go over waits with the reason "quota" and does not block anyone else.
- **No head-of-line blocking, no starvation.** The first run that waits for capacity reserves
  the nodes it will use (packed onto node totals, preferring the freest nodes). Later, smaller
  runs may start meanwhile (backfill) only on what is left outside that reservation, so they
  can never delay it. Nothing running is ever preempted.
"""

from __future__ import annotations

import heapq
from collections import defaultdict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from service.scheduling.fit import on_empty_cluster
from service.scheduling.inventory import Inventory
from service.scheduling.placement import EPS, Fitter, Placement, Pool, pack
from service.scheduling.shape import ResourceShape

# Resources the service's own account keeps cluster-wide.
ACCOUNTED = ("NPU", "GPU", "CPU")


@dataclass(frozen=True)
class QueuedRun:
    id: str
    team: str
    priority: int
    shape: ResourceShape


@dataclass(frozen=True)
class HeldRun:
    """An admitted run that has not ended; ``settled`` when Ray's numbers already show it."""

    id: str
    team: str
    shape: ResourceShape
    settled: bool = False


@dataclass(frozen=True)
class Quotas:
    teams: dict[str, int] = field(default_factory=dict)
    default: int | None = None

    def of(self, team: str) -> int | None:
        return self.teams.get(team, self.default)


@dataclass
class Decision:
    order: list[str]
    admit: list[str]
    reasons: dict[str, str]
    placements: dict[str, Placement]


def decide(
    queued: Sequence[QueuedRun],
    held: Sequence[HeldRun],
    inventory: Inventory,
    quotas: Quotas,
    limit: int | None = None,
    outside: Mapping[str, float] | None = None,
) -> Decision:
    """Decide one round. ``queued`` is first in, first out; ``held`` in admission order;
    ``outside``: resources that jobs which are no runs of the service hold."""
    ever = on_empty_cluster(inventory)
    totals = ever.pool
    free = Pool.of(inventory.available())
    outside = outside or {}
    sums = _Sums(inventory)
    account = {r: sums[r] - outside.get(r, 0.0) for r in ACCOUNTED}
    team_used = held_by_team(held)
    for h in held:
        _charge(account, h.shape)
        if not h.settled:
            _take_somewhere(free, h.shape)

    shapes = _Shapes()
    order = _fair_order(queued, team_used.copy(), quotas, _share(inventory), shapes)
    decision = Decision([r.id for r in order], [], {}, {})
    now = Fitter(free)
    head: QueuedRun | None = None
    unreserved: Fitter | None = None
    # A capacity reason depends on the shape and on what is free and accounted, which change
    # only when something is taken: kept per shape until then.
    waiting: dict[int, str] = {}
    for run in order:
        shape = run.shape
        info = shapes.of(shape)
        if info.ever is None:
            info.ever = ever.fit(shape, info.key) is not None
        if not info.ever:
            decision.reasons[run.id] = "capacity: can never fit this cluster's nodes"
            continue
        quota = quotas.of(run.team)
        used = team_used[run.team]
        if quota is not None and used + info.accelerators > quota:
            decision.reasons[run.id] = (
                f"quota: team {run.team} holds {used} of its {quota} accelerators; "
                f"this run needs {info.accelerators}"
            )
            continue
        placed = now.fit(shape, info.key)
        in_account = all(account[r] + EPS >= n for r, n in info.demand.items())
        if placed is not None and in_account:
            if limit is not None and len(decision.admit) >= limit:
                decision.reasons[run.id] = "next in line"
                continue
            now.take(placed)
            if unreserved is not None:
                unreserved.take(placed)
            _charge(account, shape)
            waiting.clear()
            team_used[run.team] += info.accelerators
            decision.admit.append(run.id)
            decision.placements[run.id] = placed
            continue
        if head is None:
            head = run
            decision.reasons[run.id] = _capacity_reason(shape, free, sums, account, outside)
            # Reserve the nodes the head will use (the freest first), so backfill cannot delay it.
            unreserved = Fitter(free.copy())
            freest = totals.ordered([-r.get(shape.accelerator, 0.0) for r in free.free])
            reservation = pack(shape, freest)
            if reservation is not None:
                now.take(reservation)
                waiting.clear()
        elif in_account and unreserved is not None and unreserved.fit(shape, info.key) is not None:
            decision.reasons[run.id] = _behind(head, run)
        else:
            reason = waiting.get(info.key)
            if reason is None:
                reason = waiting[info.key] = _capacity_reason(shape, free, sums, account, outside)
            decision.reasons[run.id] = reason
    return decision


@dataclass
class _Shape:
    """What one round works out once per distinct shape."""

    key: int
    accelerators: int
    demand: dict[str, float]
    ever: bool | None = None  # whether it fits the empty cluster, once asked


class _Shapes:
    """The distinct shapes of one round, each named by a small int. Runs read from the database
    carry equal shapes as distinct objects: each object is looked up by identity first, so the
    shape's value is hashed once per run, not once per question."""

    def __init__(self) -> None:
        self._by_value: dict[ResourceShape, _Shape] = {}
        self._by_id: dict[int, tuple[ResourceShape, _Shape]] = {}

    def of(self, shape: ResourceShape) -> _Shape:
        seen = self._by_id.get(id(shape))
        if seen is not None and seen[0] is shape:
            return seen[1]
        info = self._by_value.get(shape)
        if info is None:
            info = _Shape(len(self._by_value), shape.accelerators, _demand(shape))
            self._by_value[shape] = info
        self._by_id[id(shape)] = (shape, info)  # holding the shape keeps its id unique
        return info


class _Sums:
    """The cluster's total of each resource, summed over the nodes once."""

    def __init__(self, inventory: Inventory) -> None:
        self._inventory = inventory
        self._sums: dict[str, float] = {}

    def __getitem__(self, resource: str) -> float:
        if resource not in self._sums:
            self._sums[resource] = self._inventory.sum(resource)
        return self._sums[resource]


def _share(inventory: Inventory) -> float:
    return max(1.0, inventory.sum("NPU") + inventory.sum("GPU"))


def queue_order(
    queued: Sequence[QueuedRun], held: Sequence[HeldRun], inventory: Inventory, quotas: Quotas
) -> list[QueuedRun]:
    """The order in which ``decide`` considers the queue (it depends on no free resources)."""
    return _fair_order(queued, held_by_team(held), quotas, _share(inventory), _Shapes())


def held_by_team(held: Sequence[HeldRun]) -> dict[str, int]:
    """Accelerators each team's admitted, unfinished runs hold."""
    used: dict[str, int] = defaultdict(int)
    for h in held:
        used[h.team] += h.shape.accelerators
    return used


def _demand(shape: ResourceShape) -> dict[str, float]:
    need = {r: 0.0 for r in ACCOUNTED}
    need[shape.accelerator] += shape.accelerators
    need["CPU"] += sum(g.cpus for g in shape.groups) + shape.driver_cpus
    return need


def _charge(account: dict[str, float], shape: ResourceShape) -> None:
    for r, n in _demand(shape).items():
        account[r] -= n


def _take_somewhere(pool: Pool, shape: ResourceShape) -> None:
    """Account for a run wherever it fits; if it fits nowhere (the cluster shrank), anywhere."""
    placement = pack(shape, pool)
    if placement is None:
        placement = pack(shape, Pool(pool.node_ids, [dict(_BIG) for _ in pool.free]))
    if placement is not None:
        pool.take(placement)


_BIG = {"NPU": 1e12, "GPU": 1e12, "CPU": 1e12}


def _fair_order(
    queued: Sequence[QueuedRun], used: dict[str, int], quotas: Quotas, share: float, shapes: _Shapes
) -> list[QueuedRun]:
    """Priority classes, then teams by projected share used, each team first in, first out."""
    classes: dict[int, dict[str, deque[tuple[int, QueuedRun]]]] = defaultdict(
        lambda: defaultdict(deque)
    )
    for index, run in enumerate(queued):
        classes[run.priority][run.team].append((index, run))
    projected = dict(used)

    def key(team: str, runs: deque[tuple[int, QueuedRun]]) -> tuple[float, int, str]:
        weight = float(quotas.of(team) or share)
        return (projected.get(team, 0) / weight, runs[0][0], team)

    order: list[QueuedRun] = []
    for priority in sorted(classes, reverse=True):
        teams = classes[priority]
        heap = [key(team, runs) for team, runs in teams.items()]
        heapq.heapify(heap)
        while heap:
            team = heapq.heappop(heap)[2]
            _, run = teams[team].popleft()
            order.append(run)
            projected[team] = projected.get(team, 0) + shapes.of(run.shape).accelerators
            if teams[team]:
                heapq.heappush(heap, key(team, teams[team]))
    return order


def _behind(head: QueuedRun, run: QueuedRun) -> str:
    if head.priority > run.priority:
        return f"behind higher-priority run {head.id}"
    return f"behind run {head.id}, which waits for capacity (backfill would delay it)"


def _capacity_reason(
    shape: ResourceShape,
    free: Pool,
    sums: _Sums,
    account: dict[str, float],
    outside: Mapping[str, float],
) -> str:
    acc = shape.accelerator
    need = describe_groups(sorted((g.accelerators for g in shape.groups), reverse=True), acc)
    short = [r for r, n in _demand(shape).items() if account[r] + EPS < n]
    if short:
        r = short[0]
        held = sums[r] - account[r] - outside.get(r, 0.0)
        others = f" and jobs outside rlrun hold {outside[r]:g}" if outside.get(r) else ""
        return f"capacity: needs {need}; admitted runs hold {held:g}{others} of {sums[r]:g} {r}"
    return f"capacity: needs {need}; largest free: {free.largest(acc):g} {acc} on one node"


def describe_groups(sizes: Sequence[int], accelerator: str) -> str:
    if not sizes:
        return "CPUs only"
    counts: dict[int, int] = defaultdict(int)
    for size in sizes:
        counts[size] += 1
    parts = [
        f"{n} x {size} {accelerator}, each on one node"
        if n > 1
        else f"{size} {accelerator} on one node"
        for size, n in sorted(counts.items(), reverse=True)
    ]
    return ", ".join(parts)

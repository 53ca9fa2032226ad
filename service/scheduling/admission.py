"""Which queued runs go to Ray now, in what order the rest wait, and why each one waits.

- **Gang admission.** A run is admitted only when all of its groups pack onto the nodes at
  once. The free resources per node are what Ray reports available (so usage outside the
  service counts too) minus the runs admitted recently enough that Ray may not show them yet
  ("unsettled"; Ray's "available" lags). On top, the service's own account must agree: the
  cluster's totals minus everything admitted and not yet ended and minus what jobs outside the
  service hold (``outside``), whatever Ray says.
- **Order.** Priority class first (high, normal, low); within a class, teams take turns by their
  fair-share standing (``fair_share``: accelerators held lately, decayed with a half-life, plus
  those held now and by runs already ahead in the queue, divided by the team's quota or, without
  one, the cluster's accelerators); each team's own runs stay first in, first out.
- **Quotas.** A team's accelerators held by active and admitted runs never exceed its quota; a
  run that would go over waits with the reason "quota" and does not block anyone else.
- **No head-of-line blocking, no starvation.** The first run that waits for capacity reserves
  the nodes it will use (packed onto node totals, preferring the freest nodes). Later, smaller
  runs may start meanwhile (backfill) only on what is left outside that reservation, so they
  can never delay it. Admission itself never stops a running run: with
  ``RLRUN_PREEMPTION=on``, ``preemption`` asks lower-priority runs to yield (at their next
  checkpoint) for a waiting run of a higher priority, admitted here once their room is free.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from operator import itemgetter

from service.scheduling.fair_share import Standing, standing_of
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
    recent: Mapping[str, float] | None = None,
) -> Decision:
    """Decide one round. ``queued`` is first in, first out; ``held`` in admission order;
    ``outside``: resources that jobs which are no runs of the service hold; ``recent``: the
    accelerators each team held lately (``fair_share.recent_accelerators``)."""
    part = Round(held, inventory, quotas, outside)
    share = part.share
    order = fair_order(queued, part.team_used.copy(), quotas, lambda _: share, recent)
    decision = Decision([r.id for r in order], [], {}, {})
    for run in order:
        outcome = part.assess(run)
        if outcome.kind is Finds.FITS:
            if limit is not None and len(decision.admit) >= limit:
                decision.reasons[run.id] = NEXT_IN_LINE
                continue
            decision.admit.append(run.id)
            decision.placements[run.id] = part.admit(run, outcome)
            continue
        decision.reasons[run.id] = part.wait(run, outcome)
    return decision


NEXT_IN_LINE = "next in line"
NEVER = "capacity: can never fit this cluster's nodes"


class Finds(Enum):
    """What a queued run finds on one round's nodes (``Round.assess``)."""

    FITS = "fits now"
    QUOTA = "its team's quota is used"
    HEAD = "would be the first to wait for capacity here (and reserve)"
    BEHIND = "fits but for the nodes a run ahead of it reserved"
    CAPACITY = "waits for capacity"
    NEVER = "can never fit"


@dataclass(slots=True)
class Outcome:
    """What ``Round.assess`` found for a run: ``placed`` where it fits now."""

    kind: Finds
    info: ShapeInfo
    placed: Placement | None = None


class Round:
    """One round's admission state on one set of nodes (a cluster, or one node group of it):
    what is free, what the service's account leaves, the head that waits and its reservation.

    ``assess`` says what a run finds here without changing anything; ``admit`` and ``wait``
    act on it. ``decide`` drives one round in queue order; admission across clusters drives
    several, a run acting on one of them only."""

    def __init__(
        self,
        held: Sequence[HeldRun],
        inventory: Inventory,
        quotas: Quotas,
        outside: Mapping[str, float] | None = None,
        shapes: Shapes | None = None,
        quota_scope: str = "",
    ) -> None:
        self.inventory = inventory
        self.quotas = quotas
        self.quota_scope = quota_scope  # said after the quota in its reason (" on a2")
        self.shapes = shapes or Shapes()
        self.share = _share(inventory)
        self._ever = on_empty_cluster(inventory)
        self._totals = self._ever.pool
        self._capacity = self._totals  # the totals less the head's reservation
        self.free = Pool.of(inventory.available())
        self._outside = outside or {}
        self._sums = _Sums(inventory)
        self.account = {r: self._sums[r] - self._outside.get(r, 0.0) for r in ACCOUNTED}
        self.team_used = held_by_team(held)
        for h in held:
            _charge(self.account, h.shape)
            if not h.settled:
                _take_somewhere(self.free, h.shape)
        self.now = Fitter(self.free)
        self.head: QueuedRun | None = None
        self.unreserved: Fitter | None = None
        self.waiters = 0  # runs that wait here this round
        self._fits_ever: dict[int, bool] = {}
        # A capacity reason (and a head's reservation) depends on the shape and on what is free
        # and accounted, which change only when something is taken: kept per shape until then.
        self._waiting: dict[int, str] = {}
        self._reserved: dict[int, Placement | None] = {}
        self._lacks: dict[int, float] = {}
        self._freest: dict[str, Pool] = {}  # per accelerator: the capacity, freest nodes first
        self._found: dict[int, Outcome] = {}
        self._behind: dict[bool, str] = {}  # behind the head, by whether it is of higher priority

    def _changed(self) -> None:
        """What is free changed: the answers kept per shape are stale."""
        self._waiting.clear()
        self._reserved.clear()
        self._lacks.clear()
        self._freest.clear()
        self._found.clear()

    def fits_ever(self, shape: ResourceShape, key: int | None = None) -> bool:
        """Whether ``shape`` fits these nodes with nothing running."""
        if key is None:
            key = self.shapes.of(shape).key
        ever = self._fits_ever.get(key)
        if ever is None:
            ever = self._fits_ever[key] = self._ever.fit(shape, key) is not None
        return ever

    def assess(self, run: QueuedRun, info: ShapeInfo | None = None) -> Outcome:
        """What ``run`` finds here (``info``: its shape's, if the caller has it)."""
        if info is None:
            info = self.shapes.of(run.shape)
        # Beside the quota, what a run finds depends on its shape and on what changes only
        # when something is taken or a head starts to wait: kept per shape until then.
        found = self._found.get(info.key)
        if found is None:
            found = self._found[info.key] = self._find(run.shape, info)
        if found.kind is Finds.NEVER:
            return found
        quota = self.quotas.of(run.team)
        if quota is not None and self.team_used[run.team] + info.accelerators > quota:
            return Outcome(Finds.QUOTA, info)
        return found

    def _find(self, shape: ResourceShape, info: ShapeInfo) -> Outcome:
        if not self.fits_ever(shape, info.key):
            return Outcome(Finds.NEVER, info)
        placed = self.now.fit(shape, info.key)
        account = self.account
        in_account = all(account[r] + EPS >= n for r, n in info.demand.items())
        if placed is not None and in_account:
            return Outcome(Finds.FITS, info, placed)
        if self.head is None:
            return Outcome(Finds.HEAD, info)
        backfill = self.unreserved
        if in_account and backfill is not None and backfill.fit(shape, info.key) is not None:
            return Outcome(Finds.BEHIND, info)
        return Outcome(Finds.CAPACITY, info)

    def admit(self, run: QueuedRun, outcome: Outcome) -> Placement:
        """Take what ``run`` (which ``assess`` found ``Finds.FITS``) uses, and say where."""
        placed = outcome.placed
        assert placed is not None
        self.now.take(placed)
        if self.unreserved is not None:
            self.unreserved.take(placed)
        _charge(self.account, run.shape)
        self._changed()
        self.team_used[run.team] += outcome.info.accelerators
        return placed

    def reason(self, run: QueuedRun, outcome: Outcome) -> str:
        """Why ``run`` would wait here (for any outcome but ``Finds.FITS``)."""
        kind = outcome.kind
        if kind is Finds.NEVER:
            return NEVER
        if kind is Finds.QUOTA:
            return quota_reason(
                run.team,
                self.team_used[run.team],
                self.quotas.of(run.team) or 0,
                outcome.info.accelerators,
                self.quota_scope,
            )
        if kind is Finds.BEHIND:
            assert self.head is not None
            higher = self.head.priority > run.priority
            said = self._behind.get(higher)
            if said is None:
                said = self._behind[higher] = _behind(self.head, run)
            return said
        key = outcome.info.key
        reason = self._waiting.get(key)
        if reason is None:
            reason = self._waiting[key] = _capacity_reason(
                run.shape, self.free, self._sums, self.account, self._outside
            )
        return reason

    def reservation(self, shape: ResourceShape) -> Placement | None:
        """Where ``shape`` would reserve: packed onto the node totals, the freest nodes first,
        less what the head reserved (for the head itself, onto the whole totals)."""
        key = self.shapes.of(shape).key
        if key not in self._reserved:
            acc = shape.accelerator
            ordered = self._freest.get(acc)
            if ordered is None:
                keys = [-r.get(acc, 0.0) for r in self.free.free]
                ordered = self._freest[acc] = self._capacity.ordered(keys)
            self._reserved[key] = pack(shape, ordered)
        return self._reserved[key]

    def lacks(self, shape: ResourceShape) -> float:
        """The accelerators ``shape`` still lacks on the nodes it would reserve (infinite when
        it must wait for the head to end first)."""
        key = self.shapes.of(shape).key
        lacks = self._lacks.get(key)
        if lacks is None:
            reserved = self.reservation(shape)
            if reserved is None:
                lacks = float("inf")
            else:
                need: dict[str, float] = defaultdict(float)
                for slot in reserved.slots:
                    need[slot.node] += slot.accelerators
                acc, at = reserved.accelerator, self.free.at
                lacks = sum(max(0.0, n - at(node).get(acc, 0.0)) for node, n in need.items())
            self._lacks[key] = lacks
        return lacks

    def wait(self, run: QueuedRun, outcome: Outcome) -> str:
        """Record that ``run`` waits here and say why; the first to wait for capacity becomes
        the head and reserves."""
        reason = self.reason(run, outcome)
        self.waiters += 1
        if outcome.kind is Finds.HEAD:
            self.head = run
            self._found.clear()
            self._behind.clear()
            # Reserve the nodes the head will use (the freest first), so backfill cannot delay it.
            self.unreserved = Fitter(self.free.copy())
            reservation = self.reservation(run.shape)
            if reservation is not None:
                self._capacity = self._totals.copy()
                self._capacity.take(reservation)
                self.now.take(reservation)
                self._changed()
        return reason


def quota_reason(team: str, used: int, quota: int, needs: int, scope: str = "") -> str:
    return (
        f"quota: team {team} holds {used} of its {quota} accelerators{scope}; "
        f"this run needs {needs}"
    )


@dataclass
class ShapeInfo:
    """What one round works out once per distinct shape."""

    key: int
    accelerators: int
    demand: dict[str, float]
    accelerator: str = "NPU"


class Shapes:
    """The distinct shapes of one round, each named by a small int. Runs read from the database
    carry equal shapes as distinct objects: each object is looked up by identity first, so the
    shape's value is hashed once per run, not once per question."""

    def __init__(self) -> None:
        self._by_value: dict[ResourceShape, ShapeInfo] = {}
        self._by_id: dict[int, ShapeInfo] = {}
        # Every shape looked up, held so that its id names no other object meanwhile (a list,
        # not a pair per run: a round's runs leave the garbage collector less to look at).
        self._held: list[ResourceShape] = []

    def of(self, shape: ResourceShape) -> ShapeInfo:
        info = self._by_id.get(id(shape))
        if info is not None:
            return info
        info = self._by_value.get(shape)
        if info is None:
            info = ShapeInfo(
                len(self._by_value), shape.accelerators, _demand(shape), shape.accelerator
            )
            self._by_value[shape] = info
        self._by_id[id(shape)] = info
        self._held.append(shape)
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
    queued: Sequence[QueuedRun],
    held: Sequence[HeldRun],
    inventory: Inventory,
    quotas: Quotas,
    recent: Mapping[str, float] | None = None,
) -> list[QueuedRun]:
    """The order in which ``decide`` considers the queue (it depends on no free resources)."""
    share = _share(inventory)
    return fair_order(queued, held_by_team(held), quotas, lambda _: share, recent)


def standings(
    teams: Iterable[str],
    held: Sequence[HeldRun],
    inventory: Inventory,
    quotas: Quotas,
    recent: Mapping[str, float] | None = None,
) -> dict[str, Standing]:
    """Each team's fair-share standing at the start of a round, lowest (first served) first."""
    share = _share(inventory)
    used = held_by_team(held)
    out = [
        standing_of(t, used, recent or {}, lambda team: float(quotas.of(team) or share))
        for t in set(teams) | set(used)
    ]
    return {s.team: s for s in sorted(out, key=lambda s: (s.value, s.team))}


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


def fair_order(
    queued: Sequence[QueuedRun],
    used: dict[str, int],
    quotas: Quotas,
    share: Callable[[str], float],
    recent: Mapping[str, float] | None = None,
) -> list[QueuedRun]:
    """Priority classes, then teams by their standing (``fair_share``: accelerators held
    lately, plus held now and projected by the runs ahead, over the team's weight), each team
    first in, first out; ``share``: the accelerators a team without a quota is measured
    against; ``recent``: what each team held lately (none: no memory)."""
    # Per class and team: the team's runs and their places in the queue, first in first.
    classes: dict[int, dict[str, tuple[list[QueuedRun], list[int]]]] = defaultdict(dict)
    for index, run in enumerate(queued):
        teams = classes[run.priority]
        mine = teams.get(run.team)
        if mine is None:
            mine = teams[run.team] = ([], [])
        mine[0].append(run)
        mine[1].append(index)
    projected: dict[str, float] = defaultdict(float, used)
    for team, lately in (recent or {}).items():
        projected[team] += lately
    weights = {
        team: float(quotas.of(team) or share(team)) for teams in classes.values() for team in teams
    }
    order: list[QueuedRun] = []
    for priority in sorted(classes, reverse=True):
        # Each team's runs in turn, each by the standing its team has when its turn comes:
        # every team's standings only grow, so merging the teams' turns is sorting them all
        # (a run's place in the queue breaks ties, and no two runs share one).
        turns: list[tuple[float, int, QueuedRun]] = []
        for team, (runs, at) in classes[priority].items():
            held, weight = projected[team], weights[team]
            for run, index in zip(runs, at, strict=True):
                turns.append((held / weight, index, run))
                held += run.shape.accelerators
            projected[team] = held
        turns.sort(key=itemgetter(0, 1))
        order.extend(run for _, _, run in turns)
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

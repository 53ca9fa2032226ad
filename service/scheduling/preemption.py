"""Preemption for priority that loses no work: which running runs a waiting run of a higher
priority would stop, and why the others are spared. Who may be preempted is the operator's
policy (``Policy``: the priorities, the teams spared, whether a run that saves nothing may be),
never the run's own choice; victims are ranked from the service's own records, never from what
a job prints.

A queued run that cannot fit now, and would fit if some lower-priority runs were gone, preempts
them (``choose``). The victims are the fewest that make room, picked to lose the least: the
shortest time on the service's clock since the service recorded their last complete save (or
since they started), then the lowest priority, then the latest started. Each is then asked to
stop at its next checkpoint within the grace (the store does it, ``lifecycle.request_yield``),
and comes back as a new attempt that resumes from it.

A run is spared (``spared``) while it is already stopping, when its priority is not preemptible
or its team is one the operator spares, when it was admitted less than ``min_admitted_s`` ago
(as Kueue's ``minAdmitDuration`` and Slurm's ``PreemptExemptTime``), when it was preempted
``max_times`` already and its rest is not over, and when its launch saves no checkpoints and
the policy spares such runs (by default it does not: a run that saves nothing loses every step
since its start). Quotas hold: a run preempts only what leaves its team within its quota once
it is admitted.

Where the victims' groups sit is not known here (Ray places them): the room they leave is what
Ray reports free plus each victim's share, placed where packing it onto what is in use puts
it; the service's own account (totals less every admitted run and what jobs outside the service
hold) must agree, as for admission. A run's groups and its driver's CPUs are looked for on the
nodes with accelerators free (on a busy cluster, a few), which may find no room where a
driver's CPUs would fit elsewhere: then one more victim is chosen, never one too few.

On several clusters (``choose_across``) each waiting run is served on the cluster it waits for
first, else on the next it may use that can make its room; a team's quota holds over all of
them, a cluster's own quotas on it. Pure: the inventories, the runs and the clock are handed in.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import islice
from typing import Protocol

from service.scheduling.admission import ACCOUNTED, NEVER, QueuedRun, Quotas
from service.scheduling.inventory import Inventory
from service.scheduling.placement import EPS, Placement, Pool, pack
from service.scheduling.priority import PRIORITIES, PRIORITY_NAMES
from service.scheduling.shape import ResourceShape
from service.store.status import PREEMPTED_FOR

NO_CHECKPOINTS = "saves no checkpoints: never preempted"
# Waiting runs a round tries to make room for, at most (the first in queue order).
TRIES = 8


@dataclass(frozen=True)
class Policy:
    grace_s: float = 300.0
    min_admitted_s: float = 600.0
    max_times: int = 3
    rest_s: float = 3600.0
    without_checkpoints: bool = True
    preemptible: frozenset[int] = frozenset({PRIORITIES["low"], PRIORITIES["normal"]})
    spared_teams: frozenset[str] = frozenset()

    @classmethod
    def of(
        cls,
        grace_s: float,
        min_admitted_s: float,
        max_times: int,
        rest_s: float,
        without_checkpoints: bool,
        preemptible: Sequence[str],
        spared_teams: Sequence[str] = (),
    ) -> Policy:
        return cls(
            grace_s,
            min_admitted_s,
            max_times,
            rest_s,
            without_checkpoints,
            frozenset(PRIORITIES[name] for name in preemptible),
            frozenset(spared_teams),
        )

    def at_submit(self, priority: int, checkpoints: bool, team: str | None = None) -> str:
        """What would happen to a run of ``priority`` (of ``team``) if a higher one needed its
        room."""
        if priority not in self.preemptible or priority >= max(PRIORITIES.values()):
            return f"priority {name(priority)}: never preempted"
        if team is not None and team in self.spared_teams:
            return f"team {team}: never preempted"
        if not checkpoints and not self.without_checkpoints:
            return NO_CHECKPOINTS
        if not checkpoints:
            return "saves no checkpoints: may be preempted, losing every step since its start"
        return (
            f"may be preempted by a higher priority: asked to stop at its next checkpoint within "
            f"{self.grace_s:g} s, then it resumes from it"
        )


@dataclass(frozen=True)
class Running:
    """An admitted run as preemption sees it (times in epoch seconds)."""

    id: str
    team: str
    priority: int
    shape: ResourceShape
    admitted_at: float
    started_at: float | None = None
    # Whether its launch saves checkpoints (what the service composed, not what the job logs).
    saves: bool = True
    # Seconds on the service's clock since the service recorded its last complete save (or
    # since it started): what it would lose, ranked on.
    unsaved_s: float = 0.0
    # Steps the job logged since its last save: told in its history, never ranked on.
    steps_lost: int = 0
    times: int = 0  # how often it was preempted already
    last_preempted_at: float | None = None
    stopping: bool = False  # already asked to stop (by a preemption, a cancel, a deadline)
    settled: bool = True  # Ray's numbers already show it


@dataclass(frozen=True)
class Victim:
    id: str
    team: str
    priority: int
    accelerators: int
    steps_lost: int  # what it would lose if its grace ran out now

    def as_dict(self) -> dict[str, object]:
        return {
            "id": self.id,
            "team": self.team,
            "priority": name(self.priority),
            "accelerators": self.accelerators,
            "steps_lost": self.steps_lost,
        }


@dataclass
class Preemption:
    run: QueuedRun
    victims: list[Victim]
    cluster: str = ""  # where (with several clusters)

    @property
    def reason(self) -> str:
        """What each victim's history says."""
        return f"{PREEMPTED_FOR}{self.run.id} ({name(self.run.priority)})"


@dataclass
class Choice:
    preemptions: list[Preemption] = field(default_factory=list)
    # Run id -> why it is not preempted (only runs a waiting run could have used).
    spared: dict[str, str] = field(default_factory=dict)
    # Waiting run id -> the runs already stopping whose room it will have.
    waits_on: dict[str, list[str]] = field(default_factory=dict)


def waits_for_room(run: QueuedRun, reasons: Mapping[str, str]) -> bool:
    """Whether admission left ``run`` waiting for capacity (not for its quota, its budget, its
    turn in the round's batch, nor a cluster it can never fit)."""
    return _waits(reasons.get(run.id, ""))


def waiting(
    order: Sequence[str], runs: Mapping[str, QueuedRun], reasons: Mapping[str, str]
) -> list[QueuedRun]:
    """The runs admission left waiting for capacity, in ``order`` (the round's queue order)."""
    return [runs[i] for i in order if i in runs and _waits(reasons.get(i, ""))]


@lru_cache(maxsize=4096)  # a round's runs that wait alike are told the same reason
def _waits(reason: str) -> bool:
    if reason.startswith("waits for "):  # several clusters: the one it waits for comes first
        reason = reason.split(": ", 1)[-1]
    return (reason.startswith("capacity: ") and reason != NEVER) or reason.startswith("behind ")


def name(priority: int) -> str:
    return PRIORITY_NAMES.get(priority, str(priority))


def spared(run: Running, policy: Policy, now: float) -> str | None:
    """Why ``run`` may not be preempted now; None when it may."""
    if run.stopping:
        return "already stopping"
    if run.priority not in policy.preemptible:
        return f"priority {name(run.priority)} is not preemptible"
    if run.team in policy.spared_teams:
        return f"team {run.team}'s runs are not preempted"
    age = now - run.admitted_at
    if age < policy.min_admitted_s:
        return f"admitted {age:.0f} s ago (not preempted before {policy.min_admitted_s:g} s)"
    if run.times >= policy.max_times and run.last_preempted_at is not None:
        left = run.last_preempted_at + policy.rest_s - now
        if left > 0:
            return f"preempted {run.times} times: left alone for {left:.0f} s more"
    if not run.saves and not policy.without_checkpoints:
        return NO_CHECKPOINTS
    return None


def _held(runs: Iterable[Running]) -> dict[str, int]:
    """Accelerators each team's ``runs`` hold."""
    held: dict[str, int] = {}
    for r in runs:
        held[r.team] = held.get(r.team, 0) + r.shape.accelerators
    return held


def _loss(run: Running) -> tuple[float, int, float]:
    """Least loss first: the service's time since the save it recorded last (a run that saves
    nothing loses all), then the lowest priority, then the latest started."""
    lost = run.unsaved_s if run.saves else float("inf")
    return (lost, run.priority, -(run.started_at or run.admitted_at))


class _Room:
    """What the nodes would hold free if some admitted runs were gone: what Ray reports free
    (less the runs admitted too recently for Ray to show), plus each victim's share, placed
    where packing it onto what is in use puts it."""

    def __init__(
        self, inventory: Inventory, running: Sequence[Running], outside: Mapping[str, float]
    ) -> None:
        free = Pool.of(inventory.available())
        for run in running:
            if not run.settled:
                placed = pack(run.shape, free)
                if placed is not None:
                    free.take(placed)
        self.free = free
        totals = inventory.totals()
        # What is in use per node (packing reads only the accelerators and CPUs of a node).
        self.used = Pool(
            list(free.node_ids),
            [
                {r: max(0.0, totals[node].get(r, 0.0) - left[r]) for r in ACCOUNTED if r in left}
                for node, left in zip(free.node_ids, free.free, strict=True)
            ],
        )
        self.index = {node: i for i, node in enumerate(free.node_ids)}
        self.placed: dict[str, Placement | None] = {}
        self._demands: dict[str, dict[str, float]] = {}
        # Per accelerator: the nodes (in order) with some of it free; until the next take.
        self._useful: dict[str, list[int]] = {}
        self.account = {r: inventory.sum(r) - outside.get(r, 0.0) for r in ACCOUNTED}
        for run in running:
            for r, n in self._demand(run).items():
                self.account[r] -= n

    def _demand(self, run: Running) -> dict[str, float]:
        demand = self._demands.get(run.id)
        if demand is None:
            demand = self._demands[run.id] = _demand(run.shape)
        return demand

    def _where(self, run: Running) -> Placement | None:
        """Where ``run``'s share is taken to be (worked out once per run)."""
        if run.id not in self.placed:
            placed = pack(run.shape, self.used)
            if placed is not None:
                self.used.take(placed)
            self.placed[run.id] = placed
        return self.placed[run.id]

    def _given(
        self, gone: Sequence[Running]
    ) -> tuple[dict[str, float], list[dict[str, float]], set[int]]:
        """The account and what is free per node with ``gone`` gone, and the nodes they free."""
        account = dict(self.account)
        free = list(self.free.free)
        copied: set[int] = set()
        for run in gone:
            for r, n in self._demand(run).items():
                account[r] += n
            placement = self._where(run)
            if placement is None:
                continue
            for slot in placement.slots:
                i = self.index[slot.node]
                if i not in copied:
                    free[i] = dict(free[i])
                    copied.add(i)
                res = free[i]
                res[placement.accelerator] = res.get(placement.accelerator, 0.0) + slot.accelerators
                res["CPU"] = res.get("CPU", 0.0) + slot.cpus
        return account, free, copied

    def fits(self, shape: ResourceShape, gone: Sequence[Running]) -> Placement | None:
        account, free, freed = self._given(gone)
        if any(account[r] + EPS < n for r, n in _demand(shape).items()):
            return None
        ids = self.free.node_ids
        if shape.groups:  # packed on the nodes with accelerators free (the driver's CPUs too)
            acc = shape.accelerator
            useful = self._useful.get(acc)
            if useful is None:
                useful = self._useful[acc] = [
                    i for i, r in enumerate(self.free.free) if r.get(acc, 0.0) > EPS
                ]
            more = [i for i in freed if free[i].get(acc, 0.0) > EPS]
            if more:  # a node only gains from the gone runs: those free before stay useful
                useful = sorted(set(useful).union(more))
            return pack(shape, Pool([ids[i] for i in useful], [free[i] for i in useful]))
        return pack(shape, Pool(list(ids), free))  # pack reads a pool, never changes it

    def take(self, placement: Placement, shape: ResourceShape, gone: Sequence[Running]) -> None:
        """The preemptor is as good as admitted: its victims' room is its."""
        account, free, freed = self._given(gone)
        for slot in placement.slots:  # only the nodes it takes from change (the rest shared)
            i = self.index[slot.node]
            if i not in freed:
                free[i] = dict(free[i])
                freed.add(i)
        self.account = account
        self.free = Pool(list(self.free.node_ids), free)
        self.free.take(placement)
        self._useful.clear()
        for r, n in _demand(shape).items():
            self.account[r] -= n


def _demand(shape: ResourceShape) -> dict[str, float]:
    need = {r: 0.0 for r in ACCOUNTED}
    need[shape.accelerator] += shape.accelerators
    need["CPU"] += sum(g.cpus for g in shape.groups) + shape.driver_cpus
    return need


@dataclass(frozen=True)
class Site:
    """One cluster as preemption sees it: its nodes, its admitted runs not ended (in admission
    order), what jobs outside the service hold there, and its own quotas."""

    inventory: Inventory
    running: Sequence[Running]
    outside: Mapping[str, float] = field(default_factory=dict)
    quotas: Quotas = field(default_factory=Quotas)


class _Site:
    """A cluster in one round of choosing: the room its runs would leave, the runs already
    stopping (their room given to the first waiting run it fits), the runs still free to be
    chosen, each team's accelerators there."""

    def __init__(self, name: str, site: Site, policy: Policy, now: float) -> None:
        self.name, self.site, self.policy, self.now = name, site, policy, now
        self.stopping = [r for r in site.running if r.stopping]
        self.free_runs = {r.id: r for r in site.running if not r.stopping}
        self.held = _held(site.running)
        self._room: _Room | None = None
        # Whether a run is spared, and its loss, depend on it, the policy and the clock only:
        # asked once. The spared stay free (never victims); the others, least loss first (ties
        # in admission order, as sorting each waiting run's own would give).
        self._kept: list[tuple[Running, str]] | None = None
        self._ranked: list[Running] = []
        self._told = min(policy.preemptible)  # spared runs below this are in choice.spared

    @property
    def room(self) -> _Room:
        if self._room is None:
            self._room = _Room(self.site.inventory, self.site.running, self.site.outside)
        return self._room

    def serve(self, run: QueuedRun, held_all: dict[str, int], quota: int | None, c: Choice) -> bool:
        """Make ``run``'s room here: from what is stopping already, else by preempting the
        fewest lower-priority runs that lose the least, within its team's quotas (``quota``
        over every cluster, with ``held_all``; this cluster's own)."""
        if _made_by_stopping(self.room, run, self.stopping, c):
            self.stopping = []
            return True
        if self._kept is None:
            self._kept = []
            for other in self.free_runs.values():
                why = spared(other, self.policy, self.now)
                if why is None:
                    self._ranked.append(other)
                else:
                    self._kept.append((other, why))
            self._ranked.sort(key=_loss)
        if run.priority > self._told:
            for other, why in self._kept:
                if other.priority < run.priority:
                    c.spared.setdefault(other.id, why)
            self._told = run.priority
        eligible = [o for o in self._ranked if o.priority < run.priority and o.id in self.free_runs]
        limits = [(quota, held_all), (self.site.quotas.of(run.team), self.held)]
        if not _preempt(run, eligible, self.stopping, self.room, limits, self.free_runs, c):
            return False
        c.preemptions[-1].cluster = self.name
        self.stopping = []  # given to this run: the next waiting run needs room of its own
        return True


def choose(
    waiting: Sequence[QueuedRun],
    running: Sequence[Running],
    inventory: Inventory,
    quotas: Quotas,
    policy: Policy,
    now: float,
    outside: Mapping[str, float] | None = None,
    tries: int = TRIES,
) -> Choice:
    """The preemptions of one round on one cluster. ``waiting``: the queued runs admission left
    waiting for capacity, in queue order; ``running``: every admitted run not ended, in
    admission order (those already stopping count as gone)."""
    site = Site(inventory, running, outside or {})
    return choose_across(waiting, {"": site}, {}, quotas, policy, now, tries)


def choose_across(
    waiting: Sequence[QueuedRun],
    sites: Mapping[str, Site],
    where: Mapping[str, Sequence[str]],
    quotas: Quotas,
    policy: Policy,
    now: float,
    tries: int = TRIES,
) -> Choice:
    """The preemptions of one round over several clusters: each waiting run (in queue order)
    is served on the first of the clusters ``where`` names for it (the one it waits for first)
    that can make its room; a run ``where`` does not name may use any of ``sites`` in their
    order. ``quotas`` hold over all clusters together, each ``Site.quotas`` on its own."""
    choice = Choice()
    if not policy.preemptible or not waiting or not any(s.running for s in sites.values()):
        return choice
    lowest = min(policy.preemptible)
    held_all = _held(r for site in sites.values() for r in site.running)
    state: dict[str, _Site] = {}
    for run in _asked(waiting, lowest, tries):
        quota = quotas.of(run.team)
        for name in where.get(run.id, sites):
            if name not in sites:
                continue
            if name not in state:
                state[name] = _Site(name, sites[name], policy, now)
            if state[name].serve(run, held_all, quota, choice):
                break
    return choice


class Room(Protocol):
    """What the nodes would hold free if some running runs were gone (``_Room``)."""

    def fits(self, shape: ResourceShape, gone: Sequence[Running]) -> Placement | None: ...

    def take(self, placement: Placement, shape: ResourceShape, gone: Sequence[Running]) -> None: ...


def _asked(waiting: Sequence[QueuedRun], lowest: int, tries: int) -> Iterator[QueuedRun]:
    """The waiting runs a round tries to make room for: the first ``tries`` above ``lowest``."""
    return islice((run for run in waiting if run.priority > lowest), tries)


def _made_by_stopping(
    room: Room, run: QueuedRun, stopping: Sequence[Running], choice: Choice
) -> bool:
    """Whether what is stopping already makes ``run``'s room: then it is taken, and the run
    waits on them (nothing more to stop)."""
    made = room.fits(run.shape, stopping)
    if made is None:
        return False
    if stopping:
        choice.waits_on[run.id] = [r.id for r in stopping]
    room.take(made, run.shape, stopping)
    return True


def _preempt(
    run: QueuedRun,
    eligible: Sequence[Running],
    stopping: Sequence[Running],
    room: Room,
    limits: Sequence[tuple[int | None, dict[str, int]]],
    free_runs: dict[str, Running],
    choice: Choice,
) -> bool:
    """Stop for ``run`` the fewest of ``eligible`` (least loss first) that make its room beside
    what is ``stopping`` already, within its team's quota of each of ``limits`` (a quota and
    what each team holds under it). When they do: the room is taken, the victims leave
    ``free_runs``, each ``limits``' holdings count the change, and ``choice`` records it."""
    victims: list[Running] = []
    placed = None
    for other in eligible:
        victims.append(other)
        placed = room.fits(run.shape, [*stopping, *victims])
        if placed is not None:
            break
    if placed is None:
        return False
    # The fewest that make room: drop any victim the rest can do without, costliest first.
    for other in sorted(victims, key=_loss, reverse=True):
        fewer = [v for v in victims if v is not other]
        again = room.fits(run.shape, [*stopping, *fewer])
        if again is not None:
            victims, placed = fewer, again
    mine = sum(v.shape.accelerators for v in victims if v.team == run.team)
    for quota, held in limits:
        if quota is not None and held.get(run.team, 0) - mine + run.shape.accelerators > quota:
            return False  # no team preempts its way over its quota
    room.take(placed, run.shape, victims)
    for v in victims:
        free_runs.pop(v.id, None)
        for _, held in limits:
            held[v.team] -= v.shape.accelerators
    for _, held in limits:
        held[run.team] = held.get(run.team, 0) + run.shape.accelerators
    seen = [Victim(v.id, v.team, v.priority, v.shape.accelerators, v.steps_lost) for v in victims]
    choice.preemptions.append(Preemption(run, seen))
    return True

"""Admission across several Ray clusters: one queue, each run placed where it starts soonest.

Every cluster (and every node group of one, see ``node_groups``) keeps its own admission
round (``admission.Round``): what is free there, the service's account, the one run that
waits there first and the nodes it reserves. The queue is taken once, in the fair order of
``admission`` over all clusters (a team without a quota is measured against the accelerators
of the clusters its runs may use), and each run is offered to the clusters it may go to:

- **Fits now** on one or more: admitted on the one it fills most tightly (fewest accelerators
  of its kind left free there), so the roomier clusters stay whole for larger runs.
- **Fits later**: it waits for the cluster where it would start soonest, the one with the
  fewest runs waiting there ahead of it, then the fewest accelerators it still lacks on the
  nodes it would use. Only there does it count as waiting: if it is the first to wait there it
  reserves the nodes it will use, and backfill goes on everywhere else.
- **Never fits** (or its team is at its quota on a cluster, or the cluster is down): said per
  cluster; a run that fits no cluster now or later waits for a quota, then for a cluster that is
  down ("cluster down"), then can never fit.

Quotas hold globally (``quotas``: a team's accelerators on every cluster, those admitted
earlier in the same round included) and per cluster (``ClusterState.quotas``). ``limit`` caps
the admissions of the round over all clusters, in queue order. With one cluster this decides as
``node_groups.decide_grouped`` does, but for a limit with node groups: that caps group by group,
this in queue order.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Final, Literal

from service.scheduling.admission import (
    NEXT_IN_LINE,
    Finds,
    HeldRun,
    Outcome,
    QueuedRun,
    Quotas,
    Round,
    ShapeInfo,
    Shapes,
    fair_order,
    held_by_team,
    quota_reason,
)
from service.scheduling.fair_share import standing_of
from service.scheduling.inventory import Inventory
from service.scheduling.node_groups import NodeGroups, no_nodes
from service.scheduling.outside import ClusterJob, held_outside
from service.scheduling.placement import Placement

FITS_NOW = "fits now"
CLUSTER_DOWN = "cluster down"
NO_CLUSTER = "no cluster this run may use"
_WAITS = (Finds.HEAD, Finds.BEHIND, Finds.CAPACITY)


@dataclass(frozen=True)
class ClusterState:
    name: str
    inventory: Inventory | None  # None: the cluster is down or unreadable
    held: Sequence[HeldRun]  # the service's runs admitted on it and not ended
    outside: Sequence[ClusterJob] = ()  # jobs on it that are no runs of the service
    groups: NodeGroups = field(default_factory=NodeGroups)  # nodes per team on this cluster
    quotas: Quotas = field(default_factory=Quotas)  # per-cluster quotas; Quotas() = none
    down: str | None = None  # why it is not usable now, e.g. "cluster down since 12:01:03"


@dataclass
class ClusterDecision:
    admit: list[tuple[str, str]]  # (run id, cluster), in queue order
    reasons: dict[str, str]  # run id -> the one line stored as queue_reason
    # Run id -> cluster -> that cluster's reason (read only: runs told alike share one).
    by_cluster: dict[str, dict[str, str]]
    placements: dict[str, Placement]
    order: list[str] = field(default_factory=list)  # run ids in the order they were decided
    # Run id -> the cluster it was admitted to or waits for, and why that one.
    chosen: dict[str, str] = field(default_factory=dict)
    why: dict[str, str] = field(default_factory=dict)


class _Cluster:
    """One cluster in a round: a ``Round`` per node group its queued runs map to."""

    def __init__(self, state: ClusterState, shapes: Shapes) -> None:
        self.state = state
        self.name = state.name
        self.shapes = shapes
        self.down = _down(state.down) if state.down is not None else None
        if state.inventory is None:
            self.down = self.down or CLUSTER_DOWN
        self._rounds: dict[str | None, Round] = {}
        self._by_team: dict[str, Round] = {}
        self.grouped = bool(state.groups)
        self._group_of: dict[str, str | None] = {}

    def group_of(self, team: str) -> str | None:
        if team not in self._group_of:
            self._group_of[team] = self.state.groups.group_of(team) if self.state.groups else None
        return self._group_of[team]

    def view(self, key: str | None) -> Inventory:
        """The nodes of group ``key`` (the whole cluster without groups)."""
        return self._round_of_group(key).inventory

    def round_of(self, team: str) -> Round:
        part = self._by_team.get(team)
        if part is None:
            part = self._by_team[team] = self._round_of_group(self.group_of(team))
        return part

    def _round_of_group(self, key: str | None) -> Round:
        part = self._rounds.get(key)
        if part is None:
            state = self.state
            inventory = state.inventory or Inventory(())
            if self.grouped:
                nodes, held, outside = state.groups.part(key, inventory, state.held, state.outside)
            else:
                nodes, held, outside = inventory, list(state.held), held_outside(state.outside)
            part = Round(held, nodes, state.quotas, outside, self.shapes, f" on {self.name}")
            self._rounds[key] = part
        return part

    def reason(self, run: QueuedRun, part: Round, outcome: Outcome) -> str:
        if self.grouped and not part.inventory.nodes:
            return no_nodes(self.group_of(run.team))
        return part.reason(run, outcome)


@dataclass(slots=True)
class _Offer:
    """What one run finds on one cluster it may go to."""

    cluster: _Cluster
    part: Round | None  # the cluster's round for the run's team (None: no nodes known)
    outcome: Outcome | None  # None: it may fit but was not offered (down, global quota)
    reason: str


def decide_across(
    clusters: Sequence[ClusterState],
    queued: Sequence[QueuedRun],
    candidates: Mapping[str, Sequence[str]],
    quotas: Quotas,
    limit: int | None = None,
    recent: Mapping[str, float] | None = None,
) -> ClusterDecision:
    """Decide one round over every cluster. ``queued`` is first in, first out; ``candidates``
    maps a run id to the clusters it may go to (the team's rules and the run's selector
    applied), most preferred first (a run it does not name may go nowhere); ``quotas`` hold
    over all clusters together, each ``ClusterState.quotas`` on its cluster besides; ``recent``:
    the accelerators each team held lately (``fair_share``); given (even empty), a run that
    waits for capacity while other teams queue in its priority class is told its team's
    standing."""
    shapes = Shapes()
    by_name = {c.name: _Cluster(c, shapes) for c in clusters}
    alone = len(clusters) == 1
    where = _where(queued, candidates, by_name)
    used = held_by_team([h for c in clusters for h in c.held])
    shares = _shares(queued, where)
    order = fair_order(queued, dict(used), quotas, shares, recent)
    decision = ClusterDecision([], {}, {}, {}, [r.id for r in order])
    told = _Told(
        queued if recent is not None else (),
        used,
        recent or {},
        lambda team: float(quotas.of(team) or shares(team)),
    )
    step = _Step(decision, used, quotas, limit, alone, told)
    # With one cluster, what a run is told depends on its team, its shape and its priority
    # only, until something is admitted or a run starts to wait first (and reserves): worked
    # out once per such kind of run until then.
    said: dict[tuple[str, int, int], _Said] = {}
    for run in order:
        mine = where[run.id]
        if not mine:
            decision.by_cluster[run.id] = {}
            decision.reasons[run.id] = NO_CLUSTER
            continue
        info = shapes.of(run.shape)
        if not alone:
            step.take(run, info, mine)
            continue
        kind = (run.team, info.key, run.priority)
        known = said.get(kind)
        if known is not None:
            known.tell(run.id, decision)
            continue
        counted = step.take(run, info, mine)
        if counted is _CHANGED:
            said.clear()
        else:
            said[kind] = _Said.of(decision, run.id, counted)
    return decision


@dataclass(slots=True)
class _Said:
    """What a run was told, to tell the next run of its kind (``counted``: the round where it
    counts as waiting)."""

    by_cluster: dict[str, str]
    reason: str
    chosen: str | None
    why: str | None
    counted: Round | None

    @classmethod
    def of(cls, decision: ClusterDecision, run_id: str, counted: Round | None) -> _Said:
        return cls(
            decision.by_cluster[run_id],
            decision.reasons[run_id],
            decision.chosen.get(run_id),
            decision.why.get(run_id),
            counted,
        )

    def tell(self, run_id: str, decision: ClusterDecision) -> None:
        decision.by_cluster[run_id] = self.by_cluster
        decision.reasons[run_id] = self.reason
        if self.chosen is not None:
            decision.chosen[run_id] = self.chosen
        if self.why is not None:
            decision.why[run_id] = self.why
        if self.counted is not None:
            self.counted.waiters += 1


class _Changed(Enum):
    """``_Step.take`` admitted a run or made it the first to wait somewhere (which reserves)."""

    CHANGED = "changed"


_CHANGED: Final = _Changed.CHANGED


@dataclass
class _Step:
    """One run's turn in a round: offered to each cluster it may go to, admitted or told why
    it waits."""

    decision: ClusterDecision
    used: dict[str, int]  # accelerators per team over all clusters, this round's admissions in
    quotas: Quotas
    limit: int | None
    alone: bool
    told: _Told

    def take(
        self, run: QueuedRun, info: ShapeInfo, mine: list[_Cluster]
    ) -> Round | Literal[_Changed.CHANGED] | None:
        """Decide ``run``; returns ``_CHANGED`` when that changed what later runs find, else
        the round where it counts as waiting (None: it does not wait for capacity)."""
        decision, used, alone = self.decision, self.used, self.alone
        reasons: dict[str, str] = {}
        decision.by_cluster[run.id] = reasons
        quota = self.quotas.of(run.team)
        over = None
        if quota is not None and used[run.team] + info.accelerators > quota:
            over = quota_reason(run.team, used[run.team], quota, info.accelerators)
        found = [_offer(cluster, run, info, over) for cluster in mine]
        for offer in found:
            reasons[offer.cluster.name] = offer.reason
        fitting = [o for o in found if o.outcome is not None and o.outcome.kind is Finds.FITS]
        if fitting:
            if self.limit is not None and len(decision.admit) >= self.limit:
                for offer in fitting:
                    reasons[offer.cluster.name] = NEXT_IN_LINE
                name = fitting[0].cluster.name
                decision.reasons[run.id] = _say(alone, name, reasons)
                decision.chosen[run.id] = name
                decision.why[run.id] = "fits now; the round's admissions are all taken"
                return None
            best = min(fitting, key=_free_left)
            part, outcome = _offered(best)
            decision.placements[run.id] = part.admit(run, outcome)
            decision.admit.append((run.id, best.cluster.name))
            decision.chosen[run.id] = best.cluster.name
            decision.why[run.id] = (
                f"fits now on {len(fitting)} clusters; this one it fills most tightly"
                if len(fitting) > 1
                else "fits now"
            )
            used[run.team] += info.accelerators
            return _CHANGED
        if over is not None and any(o.outcome is None for o in found):
            decision.reasons[run.id] = over
            return None
        waits = [o for o in found if o.outcome is not None and o.outcome.kind in _WAITS]
        if waits:
            best = _soonest(waits, run)
            part, outcome = _offered(best)
            ahead = part.waiters
            part.wait(run, outcome)
            if ahead and not alone:
                reasons[best.cluster.name] += (
                    f"; {ahead} run{'s' if ahead > 1 else ''} ahead of it wait there"
                )
            decision.reasons[run.id] = self.told.after(run, _say(alone, best.cluster.name, reasons))
            decision.chosen[run.id] = best.cluster.name
            decision.why[run.id] = (
                f"fits later on {len(waits)} clusters; it would start soonest on this one "
                "(fewest runs waiting ahead of it, then fewest accelerators it still lacks)"
                if len(waits) > 1
                else "the one cluster where it fits once runs ahead of it end"
            )
            return _CHANGED if outcome.kind is Finds.HEAD else part
        chosen = next(
            (o for o in found if o.outcome is not None and o.outcome.kind is Finds.QUOTA), None
        )
        chosen = chosen or next((o for o in found if o.outcome is None), None)
        if chosen is not None:
            decision.reasons[run.id] = _say(alone, chosen.cluster.name, reasons)
            decision.chosen[run.id] = chosen.cluster.name
            decision.why[run.id] = (
                "its team's quota on this cluster is all that stops it"
                if chosen.outcome is not None
                else "the only clusters where it could fit are down"
            )
        elif alone:
            decision.reasons[run.id] = found[0].reason
        else:
            names = ", ".join(c.name for c in mine)
            decision.reasons[run.id] = (
                f"capacity: can never fit the nodes of any cluster it may use ({names})"
            )
        return None


def _where(
    queued: Sequence[QueuedRun],
    candidates: Mapping[str, Sequence[str]],
    by_name: Mapping[str, _Cluster],
) -> dict[str, list[_Cluster]]:
    """Per run, the clusters it may go to (each once, most preferred first); runs naming the
    same clusters share one list."""
    lists: dict[tuple[str, ...], list[_Cluster]] = {}
    where = {}
    for r in queued:
        names = tuple(candidates.get(r.id, ()))
        mine = lists.get(names)
        if mine is None:
            mine = lists[names] = [by_name[n] for n in dict.fromkeys(names) if n in by_name]
        where[r.id] = mine
    return where


class _Told:
    """A waiting run's team standing, said after its reason when other teams queue in its
    priority class (their turns are what the standing decides); each team's is worked out once,
    at the start of the round."""

    def __init__(
        self,
        queued: Sequence[QueuedRun],
        used: Mapping[str, int],
        recent: Mapping[str, float],
        weight: Callable[[str], float],
    ) -> None:
        teams: dict[int, set[str]] = defaultdict(set)
        for run in queued:
            teams[run.priority].add(run.team)
        self._shared = {p for p, names in teams.items() if len(names) > 1}
        self._used, self._recent, self._weight = used, recent, weight
        self._said: dict[str, str] = {}

    def after(self, run: QueuedRun, reason: str) -> str:
        if run.priority not in self._shared:
            return reason
        said = self._said.get(run.team)
        if said is None:
            standing = standing_of(run.team, self._used, self._recent, self._weight)
            said = self._said[run.team] = f"; {standing.says()}"
        return reason + said


def _offer(cluster: _Cluster, run: QueuedRun, info: ShapeInfo, over: str | None) -> _Offer:
    """What ``run`` finds on ``cluster``; ``over``: the global quota's reason if it is over it."""
    if cluster.state.inventory is None:
        return _Offer(cluster, None, None, cluster.down or CLUSTER_DOWN)
    part = cluster.round_of(run.team)
    if cluster.down is not None or over is not None:
        # Not offered: its last known nodes only say whether it could ever fit.
        if part.fits_ever(run.shape, info.key):
            return _Offer(cluster, part, None, cluster.down or over or "")
        outcome = Outcome(Finds.NEVER, info)
    else:
        outcome = part.assess(run, info)
    if outcome.kind is Finds.FITS:
        return _Offer(cluster, part, outcome, FITS_NOW)
    return _Offer(cluster, part, outcome, cluster.reason(run, part, outcome))


def _down(why: str) -> str:
    return why if why.startswith(CLUSTER_DOWN) else f"{CLUSTER_DOWN}: {why}"


def _say(alone: bool, chosen: str, reasons: Mapping[str, str]) -> str:
    """The queue reason: with one cluster its own; else the cluster it waits for, then the rest."""
    if alone:
        return reasons[chosen]
    rest = "".join(f"; {c}: {r}" for c, r in reasons.items() if c != chosen)
    return f"waits for {chosen}: {reasons[chosen]}{rest}"


def _offered(offer: _Offer) -> tuple[Round, Outcome]:
    part, outcome = offer.part, offer.outcome
    assert part is not None, "only a cluster with nodes is offered a run"
    assert outcome is not None, "only a cluster offered the run has an outcome"
    return part, outcome


def _free_left(offer: _Offer) -> float:
    """Accelerators of the run's kind free (outside reservations) where it fits now."""
    part, outcome = _offered(offer)
    return part.now.pool.pairs(outcome.info.accelerator)[1]


def _soonest(waits: list[_Offer], run: QueuedRun) -> _Offer:
    """Where ``run`` would start soonest: the cluster with the fewest runs waiting there ahead
    of it, then the fewest accelerators it still lacks on the nodes it would use there (past
    what the first of them reserved); then the first candidate."""
    fewest = min(_offered(o)[0].waiters for o in waits)
    tied = [o for o in waits if _offered(o)[0].waiters == fewest]
    if len(tied) == 1:
        return tied[0]
    return min(tied, key=lambda o: _offered(o)[0].lacks(run.shape))


def _shares(
    queued: Sequence[QueuedRun], where: Mapping[str, list[_Cluster]]
) -> Callable[[str], float]:
    """Per team: the accelerators of the clusters (its node group on each) its runs may use."""
    clusters: dict[str, dict[str, _Cluster]] = defaultdict(dict)
    for run in queued:
        for cluster in where[run.id]:
            clusters[run.team][cluster.name] = cluster
    memo: dict[str, float] = {}
    sums: dict[tuple[str, str | None], float] = {}

    def share(team: str) -> float:
        if team not in memo:
            total = 0.0
            for cluster in clusters[team].values():
                if cluster.down is None:
                    key = (cluster.name, cluster.group_of(team))
                    if key not in sums:
                        view = cluster.view(key[1])
                        sums[key] = view.sum("NPU") + view.sum("GPU")
                    total += sums[key]
            memo[team] = max(1.0, total)
        return memo[team]

    return share

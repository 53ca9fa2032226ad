"""Admission across clusters: one queue, each run admitted on one of the clusters it may go to.

Each cluster in turn decides (``decide_grouped``) the runs that may go there and that no earlier
cluster admitted; a cluster that is down admits nothing. Quotas are global: a team's use on the
other clusters (held, and admitted earlier in the round) counts against its quota on this one;
a cluster's own quotas apply on it besides.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from service.scheduling.admission import HeldRun, QueuedRun, Quotas, held_by_team
from service.scheduling.inventory import Inventory
from service.scheduling.node_groups import NodeGroups, decide_grouped
from service.scheduling.outside import ClusterJob
from service.scheduling.placement import Placement


@dataclass(frozen=True)
class ClusterState:
    name: str
    inventory: Inventory | None  # None: the cluster is down or unreadable
    held: Sequence[HeldRun]  # the service's runs admitted on it and not ended
    outside: Sequence[ClusterJob] = ()  # jobs on it that are no runs of the service
    groups: NodeGroups = field(default_factory=NodeGroups)
    quotas: Quotas = field(default_factory=Quotas)  # per-cluster quotas; Quotas() = none
    down: str | None = None  # why it is not usable now, e.g. "cluster down since 12:01:03"


@dataclass
class ClusterDecision:
    admit: list[tuple[str, str]]  # (run id, cluster), in queue order
    reasons: dict[str, str]  # run id -> the one line stored as queue_reason
    by_cluster: dict[str, dict[str, str]]  # run id -> cluster -> that cluster's reason
    placements: dict[str, Placement]


def decide_across(
    clusters: Sequence[ClusterState],
    queued: Sequence[QueuedRun],
    candidates: Mapping[str, Sequence[str]],
    quotas: Quotas,
    limit: int | None = None,
) -> ClusterDecision:
    """Decide one round over every cluster. ``candidates``: run id -> the clusters it may go
    to (a run missing from it may go anywhere)."""
    every = [c.name for c in clusters]
    used: dict[str, dict[str, int]] = {c.name: dict(held_by_team(c.held)) for c in clusters}
    out = ClusterDecision([], {}, defaultdict(dict), {})
    admitted: set[str] = set()
    for state in clusters:
        mine = [
            r for r in queued if r.id not in admitted and state.name in candidates.get(r.id, every)
        ]
        if not mine:
            continue
        if state.down is not None or state.inventory is None:
            why = state.down or "cluster unreadable"
            for r in mine:
                out.by_cluster[r.id][state.name] = why
            continue
        left = None if limit is None else max(0, limit - len(out.admit))
        elsewhere: dict[str, int] = defaultdict(int)
        for name, teams in used.items():
            if name != state.name:
                for team, n in teams.items():
                    elsewhere[team] += n
        here = _quotas_left(quotas, state.quotas, elsewhere, {r.team for r in mine})
        d = decide_grouped(
            state.groups, mine, state.held, state.inventory, here, left, state.outside
        )
        for run_id in d.admit:
            admitted.add(run_id)
            out.admit.append((run_id, state.name))
        out.placements |= d.placements
        shapes = {r.id: r for r in mine}
        for run_id in d.admit:
            run = shapes[run_id]
            used[state.name][run.team] = used[state.name].get(run.team, 0) + run.shape.accelerators
        for run_id, reason in d.reasons.items():
            out.by_cluster[run_id][state.name] = reason
    rank = {r.id: i for i, r in enumerate(queued)}
    out.admit.sort(key=lambda a: rank[a[0]])
    named = len(clusters) > 1
    for r in queued:
        if r.id in admitted:
            continue
        per = out.by_cluster.get(r.id, {})
        # The cluster that may take it first says why it waits: one that is up, then one that
        # is down, then one it can never fit.
        ranked = sorted(per.items(), key=lambda cw: _rank(clusters, *cw))
        chosen = ranked[0] if ranked else None
        if chosen is not None:
            out.reasons[r.id] = f"{chosen[0]}: {chosen[1]}" if named else chosen[1]
    out.by_cluster = dict(out.by_cluster)
    return out


def _rank(clusters: Sequence[ClusterState], name: str, why: str) -> int:
    if "can never fit" in why:
        return 2
    down = any(c.name == name and (c.down is not None or c.inventory is None) for c in clusters)
    return 1 if down else 0


def _quotas_left(
    quotas: Quotas, own: Quotas, elsewhere: Mapping[str, int], teams: set[str]
) -> Quotas:
    """The quotas on one cluster: the global ones less the team's use elsewhere, and the
    cluster's own, whichever is smaller."""
    if not elsewhere and not own.teams and own.default is None:
        return quotas
    out: dict[str, int] = {}
    for team in teams:
        limits = []
        if (q := quotas.of(team)) is not None:
            limits.append(max(0, q - elsewhere.get(team, 0)))
        if (c := own.of(team)) is not None:
            limits.append(c)
        if limits:
            out[team] = min(limits)
    return Quotas(out, None)

"""Nodes per team: an operator's map of teams to node groups, for harder separation on one
cluster (``RLRUN_TEAM_NODES='{"vision": "group-a", "*": "shared"}'``).

A group is a Ray custom resource that each of its nodes carries (``ray start
--resources='{"group-a": 1000}'``). A mapped team's runs are planned on its group's nodes only,
and its jobs are pinned there: the submission asks for ``PIN`` of the group's resource, so Ray
starts the job's driver on one of them. ``"*"`` maps every team not named. Teams left unmapped
share the nodes of no mapped group: admission plans them there, but Ray does not pin their
drivers, so only a map that covers every team (``"*"``) keeps all runs off a group's nodes.

Groups share no nodes, so admission decides each group (and the shared rest) on its own: the
group's runs, the runs it holds, its nodes and what jobs outside the service hold on them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from service.scheduling.admission import Decision, HeldRun, QueuedRun, Quotas, decide, queue_order
from service.scheduling.inventory import Inventory
from service.scheduling.outside import ClusterJob, held_outside

EVERY_OTHER = "*"
# What a pinned job's driver asks of its group's resource (a node carries e.g. 1000).
PIN = 0.001


@dataclass(frozen=True)
class NodeGroups:
    teams: Mapping[str, str] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.teams)

    def group_of(self, team: str) -> str | None:
        return self.teams.get(team, self.teams.get(EVERY_OTHER))

    def node_ids(self, inventory: Inventory, group: str | None) -> set[str]:
        """The nodes of ``group``; for None, the nodes of no mapped group (shared)."""
        if group is not None:
            return {n.id for n in inventory.nodes if group in n.custom}
        mapped = set(self.teams.values())
        return {n.id for n in inventory.nodes if not n.custom & mapped}

    def group_of_node(self, inventory: Inventory, node_id: str) -> str | None:
        mapped = set(self.teams.values())
        node = next((n for n in inventory.nodes if n.id == node_id), None)
        found = sorted(node.custom & mapped) if node else []
        return found[0] if found else None

    def view(self, inventory: Inventory, team: str) -> Inventory:
        """The cluster as ``team``'s runs may use it: its group's nodes only."""
        if not self:
            return inventory
        ids = self.node_ids(inventory, self.group_of(team))
        return replace(inventory, nodes=tuple(n for n in inventory.nodes if n.id in ids))

    def part(
        self,
        group: str | None,
        inventory: Inventory,
        held: Sequence[HeldRun],
        outside: Sequence[ClusterJob],
    ) -> tuple[Inventory, list[HeldRun], dict[str, float]]:
        """What admission decides ``group`` on (None: the shared nodes): its nodes, the runs its
        teams hold, and what jobs outside the service hold on its nodes."""
        ids = self.node_ids(inventory, group)
        nodes = replace(inventory, nodes=tuple(n for n in inventory.nodes if n.id in ids))
        theirs = [h for h in held if self.group_of(h.team) == group]
        return nodes, theirs, held_outside(outside, ids)

    def pin(self, team: str) -> dict[str, float]:
        """The entrypoint resources that start ``team``'s job on its group's nodes."""
        group = self.group_of(team)
        return {group: PIN} if group else {}


def decide_grouped(
    groups: NodeGroups,
    queued: Sequence[QueuedRun],
    held: Sequence[HeldRun],
    inventory: Inventory,
    quotas: Quotas,
    limit: int | None = None,
    outside: Sequence[ClusterJob] = (),
) -> Decision:
    """``admission.decide`` per node group; without groups, once for the whole cluster.
    ``outside``: the jobs on the cluster that are no runs of the service."""
    if not groups:
        return decide(queued, held, inventory, quotas, limit, outside=held_outside(outside))
    keys = sorted({groups.group_of(r.team) for r in queued}, key=lambda g: g or "")
    order = [r.id for r in queue_order(queued, held, inventory, quotas)]
    merged = Decision(order, [], {}, {})
    for key in keys:
        part, theirs, outside_part = groups.part(key, inventory, held, outside)
        mine = [r for r in queued if groups.group_of(r.team) == key]
        left = None if limit is None else max(0, limit - len(merged.admit))
        d = decide(mine, theirs, part, quotas, left, outside=outside_part)
        if not part.nodes:
            d.reasons = {r.id: no_nodes(key) for r in mine}
        merged.admit += d.admit
        merged.reasons |= d.reasons
        merged.placements |= d.placements
    rank = {run_id: i for i, run_id in enumerate(order)}
    merged.admit.sort(key=rank.__getitem__)
    return merged


def no_nodes(group: str | None) -> str:
    """Why a run of a team mapped to ``group`` waits when the group has no node."""
    where = f"node group {group}" if group else "the nodes no team is mapped to"
    return f"capacity: {where} has no node in the cluster"

"""Preemption decided the straightforward way: every waiting run asks every running run
whether it is spared and sorts its own candidates, and every question about the room copies
every node. ``preemption.choose`` must choose exactly as this does."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from service.scheduling.admission import ACCOUNTED, QueuedRun, Quotas
from service.scheduling.inventory import Inventory
from service.scheduling.placement import EPS, Placement, Pool, pack
from service.scheduling.preemption import (
    TRIES,
    Choice,
    Policy,
    Running,
    _demand,
    _loss,
    _preempt,
    spared,
)
from service.scheduling.shape import ResourceShape


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
        self.used = Pool(
            list(free.node_ids),
            [
                {r: max(0.0, totals[node].get(r, 0.0) - left.get(r, 0.0)) for r in left}
                for node, left in zip(free.node_ids, free.free, strict=True)
            ],
        )
        self.index = {node: i for i, node in enumerate(free.node_ids)}
        self.placed: dict[str, Placement | None] = {}
        self.account = {r: inventory.sum(r) - outside.get(r, 0.0) for r in ACCOUNTED}
        for run in running:
            for r, n in _demand(run.shape).items():
                self.account[r] -= n

    def _where(self, run: Running) -> Placement | None:
        """Where ``run``'s share is taken to be (worked out once per run)."""
        if run.id not in self.placed:
            placed = pack(run.shape, self.used)
            if placed is not None:
                self.used.take(placed)
            self.placed[run.id] = placed
        return self.placed[run.id]

    def _given(self, gone: Sequence[Running]) -> tuple[dict[str, float], list[dict[str, float]]]:
        account = dict(self.account)
        free = list(self.free.free)
        copied: set[int] = set()
        for run in gone:
            for r, n in _demand(run.shape).items():
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
        return account, free

    def fits(self, shape: ResourceShape, gone: Sequence[Running]) -> Placement | None:
        account, free = self._given(gone)
        if any(account[r] + EPS < n for r, n in _demand(shape).items()):
            return None
        ids = self.free.node_ids
        if shape.groups:  # packed on the nodes with accelerators free (the driver's CPUs too)
            acc = shape.accelerator
            useful = [i for i, r in enumerate(free) if r.get(acc, 0.0) > EPS]
            return pack(shape, Pool([ids[i] for i in useful], [free[i] for i in useful]))
        return pack(shape, Pool(list(ids), free))  # pack reads a pool, never changes it

    def take(self, placement: Placement, shape: ResourceShape, gone: Sequence[Running]) -> None:
        """The preemptor is as good as admitted: its victims' room is its."""
        account, free = self._given(gone)
        self.account = account
        self.free = Pool(list(self.free.node_ids), [dict(r) for r in free])
        self.free.take(placement)
        for r, n in _demand(shape).items():
            self.account[r] -= n


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
    choice = Choice()
    lowest = min(policy.preemptible, default=None)
    if lowest is None or not waiting or not running:
        return choice
    stopping = [r for r in running if r.stopping]
    held: dict[str, int] = {}
    for r in running:
        held[r.team] = held.get(r.team, 0) + r.shape.accelerators
    room: _Room | None = None
    free_runs = {r.id: r for r in running if not r.stopping}
    asked = 0
    for run in waiting:
        if run.priority <= lowest:
            continue
        if asked >= tries:
            break
        asked += 1
        if room is None:
            room = _Room(inventory, running, outside or {})
        made = room.fits(run.shape, stopping)
        if made is not None:  # what is already stopping makes its room: nothing more to stop
            if stopping:
                choice.waits_on[run.id] = [r.id for r in stopping]
            room.take(made, run.shape, stopping)
            stopping = []
            continue
        eligible = []
        for other in free_runs.values():
            if other.priority >= run.priority:
                continue
            why = spared(other, policy, now)
            if why is None:
                eligible.append(other)
            else:
                choice.spared.setdefault(other.id, why)
        eligible.sort(key=_loss)
        if _preempt(run, eligible, stopping, room, quotas.of(run.team), held, free_runs, choice):
            stopping = []  # given to this run: the next waiting run needs room of its own
    return choice

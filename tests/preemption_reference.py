"""Preemption decided the straightforward way: every waiting run asks every running run
whether it is spared and sorts its own candidates, the room looks for the nodes with
accelerators free at every question and copies every node at a take. ``preemption.choose``
must choose exactly as this does."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from service.scheduling import preemption
from service.scheduling.admission import QueuedRun, Quotas
from service.scheduling.inventory import Inventory
from service.scheduling.placement import EPS, Placement, Pool, pack
from service.scheduling.preemption import (
    TRIES,
    Choice,
    Policy,
    Running,
    _asked,
    _demand,
    _loss,
    _made_by_stopping,
    _preempt,
    spared,
)
from service.scheduling.shape import ResourceShape


class _Room(preemption._Room):
    """The room as ``preemption._Room`` keeps it, asked the straightforward way: the nodes with
    accelerators free looked for again at every question, and every node copied at a take."""

    def fits(self, shape: ResourceShape, gone: Sequence[Running]) -> Placement | None:
        account, free, _ = self._given(gone)
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
        account, free, _ = self._given(gone)
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
    for run in _asked(waiting, lowest, tries):
        if room is None:
            room = _Room(inventory, running, outside or {})
        if _made_by_stopping(room, run, stopping, choice):
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
        limits = [(quotas.of(run.team), held)]
        if _preempt(run, eligible, stopping, room, limits, free_runs, choice):
            stopping = []  # given to this run: the next waiting run needs room of its own
    return choice

"""Admission decided the straightforward way: every question asked of every run, nothing kept
between runs but what ``Fitter`` keeps. ``admission.decide`` must decide exactly as this does."""

from __future__ import annotations

from collections.abc import Sequence

from service.scheduling.admission import (
    ACCOUNTED,
    Decision,
    HeldRun,
    QueuedRun,
    Quotas,
    _behind,
    _capacity_reason,
    _charge,
    _demand,
    _Sums,
    _take_somewhere,
    held_by_team,
    queue_order,
)
from service.scheduling.fit import on_empty_cluster
from service.scheduling.inventory import Inventory
from service.scheduling.placement import EPS, Fitter, Pool, pack


def decide(
    queued: Sequence[QueuedRun],
    held: Sequence[HeldRun],
    inventory: Inventory,
    quotas: Quotas,
    limit: int | None = None,
) -> Decision:
    ever = on_empty_cluster(inventory)
    totals = ever.pool
    free = Pool.of(inventory.available())
    account = {r: inventory.sum(r) for r in ACCOUNTED}
    team_used = held_by_team(held)
    for h in held:
        _charge(account, h.shape)
        if not h.settled:
            _take_somewhere(free, h.shape)

    order = queue_order(queued, held, inventory, quotas)
    decision = Decision([r.id for r in order], [], {}, {})
    now = Fitter(free)
    head: QueuedRun | None = None
    unreserved: Fitter | None = None
    for run in order:
        shape = run.shape
        if ever.fit(shape) is None:
            decision.reasons[run.id] = "capacity: can never fit this cluster's nodes"
            continue
        quota = quotas.of(run.team)
        used = team_used[run.team]
        if quota is not None and used + shape.accelerators > quota:
            decision.reasons[run.id] = (
                f"quota: team {run.team} holds {used} of its {quota} accelerators; "
                f"this run needs {shape.accelerators}"
            )
            continue
        placed = now.fit(shape)
        in_account = all(account[r] + EPS >= n for r, n in _demand(shape).items())
        if placed is not None and in_account:
            if limit is not None and len(decision.admit) >= limit:
                decision.reasons[run.id] = "next in line"
                continue
            now.take(placed)
            if unreserved is not None:
                unreserved.take(placed)
            _charge(account, shape)
            team_used[run.team] += shape.accelerators
            decision.admit.append(run.id)
            decision.placements[run.id] = placed
            continue
        if head is None:
            head = run
            decision.reasons[run.id] = _capacity_reason(shape, free, _Sums(inventory), account, {})
            unreserved = Fitter(free.copy())
            freest = totals.ordered([-r.get(shape.accelerator, 0.0) for r in free.free])
            reservation = pack(shape, freest)
            if reservation is not None:
                now.take(reservation)
        elif in_account and unreserved is not None and unreserved.fit(shape) is not None:
            decision.reasons[run.id] = _behind(head, run)
        else:
            decision.reasons[run.id] = _capacity_reason(shape, free, _Sums(inventory), account, {})
    return decision

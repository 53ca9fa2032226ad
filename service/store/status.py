"""The run lifecycle's vocabulary: statuses, legal moves, health names. No database here."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal


class RunStatus(StrEnum):
    QUEUED = "QUEUED"
    SUBMITTED = "SUBMITTED"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"
    CANCELLED = "CANCELLED"
    LOST = "LOST"


TERMINAL = frozenset(
    {RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.STOPPED, RunStatus.CANCELLED, RunStatus.LOST}
)
ACTIVE = frozenset({RunStatus.SUBMITTED, RunStatus.RUNNING})

_ENDS = frozenset({RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.STOPPED, RunStatus.LOST})
# Polling may skip states (SUBMITTED -> SUCCEEDED); terminal states are final. A queued run
# fails without reaching Ray only when Ray refuses the job outright.
ALLOWED: dict[RunStatus, frozenset[RunStatus]] = {
    RunStatus.QUEUED: frozenset({RunStatus.SUBMITTED, RunStatus.CANCELLED, RunStatus.FAILED}),
    RunStatus.SUBMITTED: _ENDS | {RunStatus.RUNNING},
    RunStatus.RUNNING: _ENDS,
    **{s: frozenset() for s in TERMINAL},
}

# A run's health beside its status: Ray says RUNNING even while a placement group waits forever;
# health is how the service says what Ray does not.
Health = Literal[
    "ok",
    "stuck",
    "unschedulable",
    "stalled",
    "nan",
    "reward_collapse",
    "staleness_drift",
    "sync_growing",
    "idle_imbalance",
    "ray_error",
    "stopped_outside",
]
# Three checks share ``runs.health``: the reconciler (``ray_error``: Ray cannot answer for the
# run), the watchdog (``stuck``: Ray does not run it, or it prints nothing; ``unschedulable``:
# Ray's state API shows a demand of its job that no node can hold) and the metric checks
# (``nan`` over ``reward_collapse`` over ``stalled``: it runs but does not learn; then
# ``staleness_drift`` over ``sync_growing`` over ``idle_imbalance``: it learns, but wastes its
# accelerators). Each changes a run's health only from "ok" or one of its own names, so the
# first flag raised holds until the check that raised it clears it. ``stopped_outside`` (the job
# was stopped on Ray, not by the service) is the reconciler's last word on a run that has ended:
# it replaces any other health.
WATCHDOG_HEALTH: frozenset[Health] = frozenset({"ok", "stuck", "unschedulable"})
METRIC_HEALTH: frozenset[Health] = frozenset(
    {"ok", "nan", "reward_collapse", "stalled", "staleness_drift", "sync_growing", "idle_imbalance"}
)
# The metric checks read from verl's fully async metrics (``metrics.rl_signals``).
RL_HEALTH: frozenset[Health] = frozenset({"staleness_drift", "sync_growing", "idle_imbalance"})
RECONCILER_HEALTH: frozenset[Health] = frozenset({"ok", "ray_error"})


def is_allowed(src: RunStatus, dst: RunStatus) -> bool:
    return dst in ALLOWED[src]

"""The run lifecycle's vocabulary: statuses, legal moves, health names. No database here."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal


class RunStatus(StrEnum):
    """A run's status. Terminal (SUCCEEDED, FAILED, STOPPED, CANCELLED, LOST) is final: nothing
    more happens to the run, so a poller, the event stream (its ``end``), ``rlrun status
    --follow`` and the client's ``wait`` stop there; the one exception is a retry asked for by
    hand (``POST /runs/{id}/retry``). An attempt that ends FAILED or LOST while the run's retry
    policy may start another leaves the run RETRYING, not terminal, with the attempt's end in
    ``attempts[-1].status`` (and its ``failure`` once known) while its failure class is read
    from its log and, for a lost node, Ray decides the node's death: at most 120 s after the
    attempt's end, when Ray has not given the log to its end by then (unreachable, its cluster
    down) the decision is made on the log kept so far, and an event and the failure's summary
    say so (``decided on the log kept so far: ...``). Then it is QUEUED for the next attempt
    (``retry_at``: the backoff's end; ``attempts[-2]`` says how the one before ended) or ends
    as its attempt did (FAILED, LOST). Before: QUEUED (waits for admission),
    SUBMITTED (given to Ray), RUNNING. A ``run.attempt_ended`` webhook tells each attempt's end;
    ``run.failed`` only a run's final failure."""

    QUEUED = "QUEUED"
    SUBMITTED = "SUBMITTED"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"
    CANCELLED = "CANCELLED"
    LOST = "LOST"
    RETRYING = "RETRYING"


# The contract: a terminal status is final, nothing more happens to the run (but a retry a
# caller asks for by hand, ``POST /runs/{id}/retry``). An attempt that ends FAILED or LOST while
# its retry policy may start another makes the run RETRYING, with the attempt's own end beside
# it (``runs.attempt_status``), until the decision: the next attempt (QUEUED, after the backoff),
# or the attempt's end as the run's (FAILED, LOST).
TERMINAL = frozenset(
    {RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.STOPPED, RunStatus.CANCELLED, RunStatus.LOST}
)
ACTIVE = frozenset({RunStatus.SUBMITTED, RunStatus.RUNNING})
# The current attempt has ended (its job holds nothing on Ray): the run is final, or RETRYING.
ENDED = TERMINAL | {RunStatus.RETRYING}
# How an attempt that leaves its run RETRYING ended.
RETRIED_OUTCOMES = frozenset({RunStatus.FAILED, RunStatus.LOST})

_ENDS = frozenset({RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.STOPPED, RunStatus.LOST})
# Polling may skip states (SUBMITTED -> SUCCEEDED); terminal states are final. A queued run
# fails without reaching Ray only when Ray refuses the job outright. RETRYING goes back to
# QUEUED (the next attempt, ``lifecycle.requeue``) or ends as its attempt did; a cancel while it
# decides ends it so too (STOPPED would say a job was stopped: none was).
ALLOWED: dict[RunStatus, frozenset[RunStatus]] = {
    RunStatus.QUEUED: frozenset({RunStatus.SUBMITTED, RunStatus.CANCELLED, RunStatus.FAILED}),
    RunStatus.SUBMITTED: _ENDS | {RunStatus.RUNNING, RunStatus.RETRYING},
    RunStatus.RUNNING: _ENDS | {RunStatus.RETRYING},
    RunStatus.RETRYING: RETRIED_OUTCOMES | {RunStatus.QUEUED},
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
    "weights_unsynced",
    "reward_collapse",
    "staleness_drift",
    "sync_growing",
    "idle_imbalance",
    "ray_error",
    "stopped_outside",
    "resume_mismatch",
]
# Three checks share ``runs.health``: the reconciler (``ray_error``: Ray cannot answer for the
# run), the watchdog (``stuck``: Ray does not run it, or it prints nothing; ``unschedulable``:
# Ray's state API shows a demand of its job that no node can hold) and the metric checks
# (``nan`` over ``weights_unsynced``, a weight sync the rollout did not take, over
# ``reward_collapse`` over ``stalled``: it runs but does not learn; then
# ``staleness_drift`` over ``sync_growing`` over ``idle_imbalance``: it learns, but wastes its
# accelerators). Each changes a run's health only from "ok" or one of its own names, so the
# first flag raised holds until the check that raised it clears it. ``stopped_outside`` (the job
# was stopped on Ray, not by the service) is the reconciler's last word on a run that has ended:
# it replaces any other health. ``resume_mismatch`` (an attempt that did not resume where it was
# to) replaces the metric checks' names and holds until the next attempt.
WATCHDOG_HEALTH: frozenset[Health] = frozenset({"ok", "stuck", "unschedulable"})
METRIC_HEALTH: frozenset[Health] = frozenset(
    {
        "ok",
        "nan",
        "weights_unsynced",
        "reward_collapse",
        "stalled",
        "staleness_drift",
        "sync_growing",
        "idle_imbalance",
    }
)
# The metric checks read from verl's fully async metrics (``metrics.rl_signals``).
RL_HEALTH: frozenset[Health] = frozenset({"staleness_drift", "sync_growing", "idle_imbalance"})
RECONCILER_HEALTH: frozenset[Health] = frozenset({"ok", "ray_error"})
# The resume check (``metrics.resumed``): an attempt that did not resume from the checkpoint it
# was to resume from. Raised over the metric checks' names, it holds for the attempt.
RESUME_HEALTH: frozenset[Health] = frozenset({"resume_mismatch"})


def is_allowed(src: RunStatus, dst: RunStatus) -> bool:
    return dst in ALLOWED[src]


def attempt_outcome(status: str, attempt_status: str | None) -> str:
    """Where the current attempt stands: how it ended while its run is RETRYING, else the
    run's status."""
    if attempt_status and (status == RunStatus.RETRYING or status in ACTIVE):
        return attempt_status  # RETRYING, or a preempted attempt about to be requeued
    return status


# How a preempted run's stop is asked for and said (``lifecycle.request_yield``'s reason).
PREEMPTED_FOR = "preempted for run "
# How a run on a node Ray drains is asked to stop (``loops.drains``): as a preempted run, it
# comes back as its next attempt, elsewhere.
DRAINING_NODE = "draining node "

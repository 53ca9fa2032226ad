"""verl's metric key names the service reads: progress, reward, and what a run shows first."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# The parameter version: one per weight sync, the run's progress of ``total_steps``.
STEP_KEY = "fully_async/count/current_param_version"
TRAINER_STEP_KEY = "training/global_step"
REWARD_KEY = "critic/score/mean"
REWARD_MAX_KEY = "critic/score/max"
REWARD_MIN_KEY = "critic/score/min"
STALE_KEY = "fully_async/count/stale_trajectory_processed"
# verl's fully async health: how idle each group was, how long a weight sync took.
TRAINER_IDLE_KEY = "fully_async/trainer/idle_ratio"
ROLLOUTER_IDLE_KEY = "fully_async/rollouter/idle_ratio"
PARAM_SYNC_KEY = "timing_s/timing_s/param_sync"  # the double prefix is verl's own
# Where a step's time goes (``metrics.steptime``): verl's timers, as its console prints them.
STEP_TIME_KEY = "timing_s/step"
GEN_KEY = "timing_s/gen"  # fully async and V1: the trainer waiting for the rollouts' samples
UPDATE_ACTOR_KEY = "timing_s/update_actor"
V1_SYNC_KEY = "timing_s/update_weights"  # the V1 trainer's weight sync
ROLLOUTER_ACTIVE_KEY = "fully_async/rollouter/active_time"
ROLLOUTER_VERSION_KEY = "fully_async/rollouter/version_time"
V1_SWITCH_IDLE_KEY = "separate_async/switch/idle"
V1_WAIT_SAMPLES_KEY = "separate_async/switch/wait_samples"
RESPONSE_LENGTH_KEY = "response_length/mean"


def progress_key(launch: Mapping[str, Any] | None) -> str:
    """The metric a run's progress reads, as its launch names it: verl's V1 trainer syncs
    weights once a trainer step and logs no ``STEP_KEY``, so there it is ``TRAINER_STEP_KEY``."""
    key = (launch or {}).get("progress_key")
    return key if isinstance(key, str) and key else STEP_KEY

"""verl's metric key names the service reads: progress, reward, and what a run shows first."""

from __future__ import annotations

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

"""verl's fully_async_policy trainer is retiring in favour of its V1 trainer (verl PRs #7567 and
#7860; verl 0.9.1's ppo_trainer.yaml already defaults to ``trainer.use_v1``): a spec on the old
path is warned, with the V1 keys that carry its settings where the mapping exists."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

V1_LAUNCH = (
    "python -m verl.trainer.main_ppo trainer.use_v1=True trainer.v1.trainer_mode=separate_async "
    "actor_rollout_ref.hybrid_engine=False"
)
# A fully async key and the V1 key (in ppo_trainer.yaml) that takes the same value.
SAME_VALUE = {
    "async_training.trigger_parameter_sync_step": "trainer.v1.separate_async.parameter_sync_step",
    "rollout.nnodes": "actor_rollout_ref.rollout.nnodes",
    "rollout.n_gpus_per_node": "actor_rollout_ref.rollout.n_gpus_per_node",
}
# V1 bounds staleness in model versions, not as a share of samples: no value carries over.
STALENESS = "trainer.v1.sampler.max_off_policy_threshold"


def warning(get: Callable[[str], Any]) -> str:
    """The retiring path's warning for a composed config read through ``get``."""
    moved = [
        f"{old}={get(old)} -> {new}" for old, new in SAME_VALUE.items() if get(old) is not None
    ]
    sync, mini = get(next(iter(SAME_VALUE))), get("actor_rollout_ref.actor.ppo_mini_batch_size")
    if isinstance(sync, int) and isinstance(mini, int):
        moved.append(
            f"data.train_batch_size={sync * mini} (parameter_sync_step x ppo_mini_batch_size)"
        )
    spec = f"v1.parameter_sync_step={sync}, " if isinstance(sync, int) else ""
    return (
        f"verl retires the fully_async_policy trainer for its V1 trainer ({V1_LAUNCH}); "
        f"the V1 keys: {'; '.join(moved)}; async_training.staleness_threshold (a share of "
        f"samples) has no like value: V1 bounds staleness in model versions, {STALENESS}. "
        f"Here: trainer_mode=separate_async with {spec}v1.max_off_policy_threshold in place "
        "of the async_training block"
    )

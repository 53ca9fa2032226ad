"""The resource pools verl's fully async entry point builds beyond the trainer and rollout ones.

Read from verl 0.9.1: the rollouter starts a standalone reward model when
``reward.reward_model.enable`` (legacy ``reward_model.*`` keys win when set, as verl's
``migrate_legacy_reward_impl`` does): ``n_gpus_per_node * nnodes // replica`` vLLM replicas of
``TP x DP x PP`` accelerators, each its own placement group, packed like rollout replicas. With
``distillation.enabled`` it builds a teacher pool of ``distillation.n_gpus_per_node`` on each of
``distillation.nnodes`` nodes (one group per node, like the trainer's). What the service cannot
model (a colocated reward model, prefill/decode-disaggregated replicas) is refused by name.
"""

from __future__ import annotations

from typing import Any

from service.recipes.verl.hydra_check import select
from service.scheduling.shape import Group

# Bundles per accelerator: trainer-like pools hold {CPU: 3}, rollout-like replicas {CPU: 2}.
CPUS_PER_TRAINER_ACCELERATOR = 3
CPUS_PER_ROLLOUT_ACCELERATOR = 2
REPLICA_PARTS = ("tensor_model_parallel_size", "data_parallel_size", "pipeline_model_parallel_size")
RM = "reward.reward_model"
LEGACY_RM = "reward_model"
TEACHER = "distillation"
DISAGGREGATED = (
    "actor_rollout_ref.rollout.disaggregation.enabled",
    f"{RM}.rollout.disaggregation.enabled",
)


def replica_size(cfg: dict[str, Any], rollout_key: str) -> int:
    size = 1
    for part in REPLICA_PARTS:
        size *= int(select(cfg, f"{rollout_key}.{part}", 1) or 1)
    return size


def reward_model(cfg: dict[str, Any]) -> dict[str, Any]:
    """The effective reward-model settings (and the key that set each) after verl's migration."""
    out: dict[str, Any] = {}
    for name in ("enable", "enable_resource_pool", "n_gpus_per_node", "nnodes"):
        legacy = select(cfg, f"{LEGACY_RM}.{name}")
        key = f"{LEGACY_RM}.{name}" if legacy is not None else f"{RM}.{name}"
        out[name] = (select(cfg, key), key)
    for part in REPLICA_PARTS:
        legacy = select(cfg, f"{LEGACY_RM}.rollout.{part}")
        key = f"{LEGACY_RM}.rollout.{part}" if legacy is not None else f"{RM}.rollout.{part}"
        out[part] = (select(cfg, key, 1), key)
    return out


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def problems(cfg: dict[str, Any]) -> list[tuple[str, str]]:
    """``(verl key, message)`` for each pool the config asks for that cannot be counted."""
    out: list[tuple[str, str]] = []
    for key in DISAGGREGATED:
        if select(cfg, key) is True:
            out.append((key, "prefill/decode-disaggregated replicas are pools the service cannot "
                        "count yet; run without disaggregation"))  # fmt: skip
    rm = reward_model(cfg)
    if rm["enable"][0] is True:
        if rm["enable_resource_pool"][0] is not True:
            out.append((rm["enable_resource_pool"][1], "a reward model in fully async runs in its "
                        "own pool: set it True with n_gpus_per_node and nnodes"))  # fmt: skip
        for name in ("n_gpus_per_node", "nnodes", *REPLICA_PARTS):
            value, key = rm[name]
            if _count(value) is None:
                out.append((key, f"must be a positive integer for the reward model's pool "
                            f"(got {value!r})"))  # fmt: skip
        per, size = rm["n_gpus_per_node"][0], _rm_replica(rm) if not out else 0
        if not out and (per * rm["nnodes"][0] < size or (size > per and size % per)):
            msg = f"a reward-model replica of {size} accelerators (TP x DP x PP) does not fit "
            out.append(
                (rm["tensor_model_parallel_size"][1], f"{msg}its pool of {rm['nnodes'][0]} x {per}")
            )
    if select(cfg, f"{TEACHER}.enabled") is True:
        for name in ("n_gpus_per_node", "nnodes"):
            value = select(cfg, f"{TEACHER}.{name}")
            if _count(value) is None:
                out.append((f"{TEACHER}.{name}", f"must be a positive integer for the teacher "
                            f"pool (got {value!r})"))  # fmt: skip
    return out


def _rm_replica(rm: dict[str, Any]) -> int:
    size = 1
    for part in REPLICA_PARTS:
        size *= int(rm[part][0])
    return size


def groups(cfg: dict[str, Any]) -> list[Group]:
    """The groups of every extra pool (call after ``problems`` found none)."""
    out: list[Group] = []
    rm = reward_model(cfg)
    if rm["enable"][0] is True:
        per, size = rm["n_gpus_per_node"][0], _rm_replica(rm)
        replicas = per * rm["nnodes"][0] // size  # verl leaves the rest of the pool idle
        if size <= per:
            out += [
                Group("reward_model", size, float(CPUS_PER_ROLLOUT_ACCELERATOR * size))
            ] * replicas
        else:
            cpus = float(CPUS_PER_ROLLOUT_ACCELERATOR * per)
            out += [Group("reward_model", per, cpus)] * (replicas * (size // per))
    if select(cfg, f"{TEACHER}.enabled") is True:
        per, nodes = select(cfg, f"{TEACHER}.n_gpus_per_node"), select(cfg, f"{TEACHER}.nnodes")
        out += [Group("teacher", per, float(CPUS_PER_TRAINER_ACCELERATOR * per))] * nodes
    return out

"""A resolved spec as verl sees it: the Hydra overrides (each with the spec field it came from),
the argv of verl's fully async entry point, the job's runtime env, and what it holds on Ray."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import Any, Literal

from pydantic import BaseModel

from service.recipes.verl import pools
from service.recipes.verl.hydra_check import parse, select
from service.recipes.verl.overrides import Item as Item
from service.recipes.verl.overrides import Loc as Loc
from service.recipes.verl.overrides import Override
from service.recipes.verl.spec import Block, VerlFullyAsyncSpec
from service.scheduling.shape import Group, ResourceShape

MODULE = "verl.experimental.fully_async_policy.fully_async_main"
CONFIG_NAMES = {"megatron": "fully_async_ppo_megatron_trainer"}
DEFAULT_CONFIG = "fully_async_ppo_trainer"

# verl's CPU-only actors: task runner 1, trainer 10, rollouter 10, message queue 2.
DRIVER_CPUS = 1 + 10 + 10 + 2
CPUS_PER_TRAINER_ACCELERATOR = pools.CPUS_PER_TRAINER_ACCELERATOR
CPUS_PER_ROLLOUT_ACCELERATOR = pools.CPUS_PER_ROLLOUT_ACCELERATOR

# Keys the ``resources`` block owns: an override may not contradict what the run holds.
RESOURCE_KEYS = {
    "trainer.nnodes": "n_nodes_train",
    "trainer.n_gpus_per_node": "n_gpus_training",
    "rollout.nnodes": "n_nodes_rollout",
    "rollout.n_gpus_per_node": "n_gpus_rollout",
    "trainer.device": "accelerator",
}
DEVICE = {"npu": "npu", "gpu": "cuda", "cpu": "cpu"}
# The Ray resource each trainer/rollout worker takes one of. A CPU run's workers take the
# cluster's logical NPU slots (what the embedded local head declares), so admission counts them
# like any run's; its verl platform (jobs/verl_cpu) is told so.
RAY_RESOURCE: dict[str, Literal["NPU", "GPU"]] = {"npu": "NPU", "gpu": "GPU", "cpu": "NPU"}
BASE_ENV = {
    "npu": {"VERL_PLATFORM": "huawei", "VLLM_USE_V1": "1"},
    "gpu": {"VLLM_USE_V1": "1"},
    # jobs/verl_cpu's platform and shims; verl's FSDP engine is registered for cuda/npu only
    # (the engine follows the platform's device); vLLM's CPU KV cache in GiB.
    "cpu": {
        "VERL_PLATFORM": "cpu",
        "VERL_ENGINE_DEVICE": "cuda",
        "RLRUN_CPU_DEVICE_RESOURCE": RAY_RESOURCE["cpu"],
        "VLLM_CPU_KVCACHE_SPACE": "1",
    },
}
COMMON_ENV = {"HYDRA_FULL_ERROR": "1", "RAY_DEDUP_LOGS": "0"}
PLAIN = re.compile(r"[A-Za-z0-9_./-][A-Za-z0-9_./:+-]*")


class Unexpressible(ValueError):
    def __init__(self, loc: Loc, message: str) -> None:
        super().__init__(message)
        self.loc = loc


def config_name(spec: VerlFullyAsyncSpec) -> str:
    return CONFIG_NAMES.get(spec.actor.strategy, DEFAULT_CONFIG)


def overrides(spec: VerlFullyAsyncSpec, checkpoint_dir: str) -> list[Item]:
    """Every override the spec sets, in the launch script's block order, then ``overrides``."""
    return [*field_overrides(spec, checkpoint_dir), *user_overrides(spec)]


def user_overrides(spec: VerlFullyAsyncSpec) -> list[Item]:
    """The spec's own ``overrides``, each under its index."""
    return [Item(text, ("overrides", i)) for i, text in enumerate(spec.overrides)]


def field_overrides(spec: VerlFullyAsyncSpec, checkpoint_dir: str) -> list[Item]:
    """The overrides the spec's fields set, in the launch script's block order."""
    items: list[Item] = []
    for block in spec.BLOCKS:
        model = getattr(spec, block)
        _walk(model, type(model).prefix, (block,), items)
        if block == "trainer":
            for key, field in RESOURCE_KEYS.items():
                value = getattr(spec.resources, field)
                if field == "accelerator":
                    value = DEVICE[value]
                loc = ("resources", field)
                items.append(Item(f"{key}={hydra_value(value, loc)}", loc))
            if spec.trainer.default_local_dir is None:  # unset or null: the run's own dir
                loc = ("trainer", "default_local_dir")
                items = [item for item in items if item.loc != loc]
                items.append(
                    Item(f"trainer.default_local_dir={hydra_value(checkpoint_dir, loc)}", loc)
                )
    return items


def _keyed(model: type[BaseModel], prefix: str) -> Iterator[tuple[str, str, bool]]:
    """(field name, verl key, passed even when unset) for each field of a spec block."""
    for name, info in model.model_fields.items():
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        yield name, str(extra.get("verl_key") or f"{prefix}.{name}"), bool(extra.get("always"))


def _walk(model: BaseModel, prefix: str, loc: Loc, out: list[Item]) -> None:
    for name, key, always in _keyed(type(model), prefix):
        if name not in model.model_fields_set and not always:
            continue
        value = getattr(model, name)
        if isinstance(value, Block):
            _walk(value, key, (*loc, name), out)
        else:
            out.append(Item(f"{key}={hydra_value(value, (*loc, name))}", (*loc, name)))


def hydra_value(value: Any, loc: Loc) -> str:
    """``value`` in Hydra's override grammar, checked to parse back to the same value."""
    if value is None:
        text = "null"
    elif isinstance(value, bool):
        text = "True" if value else "False"
    elif isinstance(value, int | float):
        text = repr(value)
    elif isinstance(value, str):
        if "${" in value:
            raise Unexpressible(loc, "interpolations ('${') are not allowed here; use overrides")
        text = value if PLAIN.fullmatch(value) else _quote(value)
        if parse(f"k={text}").value != value:
            text = _quote(value)
    elif isinstance(value, list):
        text = "[" + ",".join(hydra_value(v, (*loc, i)) for i, v in enumerate(value)) + "]"
    else:
        raise Unexpressible(loc, f"cannot pass a {type(value).__name__} to verl")
    try:
        back = parse(f"k={text}").value
    except ValueError as exc:
        raise Unexpressible(loc, f"cannot be written as a Hydra value: {exc}") from exc
    if back != value:
        raise Unexpressible(loc, "cannot be written as a Hydra value unchanged")
    return text


def _quote(value: str) -> str:
    quote = "'" if "'" not in value else '"'
    escaped = value.replace("\\", "\\\\").replace(quote, "\\" + quote)
    return f"{quote}{escaped}{quote}"


def argv(spec: VerlFullyAsyncSpec, items: Sequence[Item | Override]) -> list[str]:
    return [
        "python3",
        "-m",
        MODULE,
        "--config-path=config",
        f"--config-name={config_name(spec)}.yaml",
        *(item.text for item in items),
    ]


def service_env(spec: VerlFullyAsyncSpec, stop_grace_s: int) -> dict[str, str]:
    """The variables the service sets for every job of this accelerator (a spec may not)."""
    return {
        **BASE_ENV[spec.resources.accelerator],
        **COMMON_ENV,
        "RAY_JOB_STOP_WAIT_TIME_S": str(stop_grace_s),
    }


def runtime_env(spec: VerlFullyAsyncSpec, stop_grace_s: int) -> dict[str, Any]:
    # The service's own variables come last: they win over anything of the spec's.
    env = {**spec.runtime_env.env_vars, **service_env(spec, stop_grace_s)}
    out: dict[str, Any] = {"env_vars": env}
    if spec.runtime_env.pip:
        out["pip"] = list(spec.runtime_env.pip)
    return out


def rollout_replica_size(cfg: dict[str, Any]) -> int:
    return pools.replica_size(cfg, "actor_rollout_ref.rollout")


def shape(cfg: dict[str, Any], accelerator: str) -> ResourceShape:
    """What the run holds: one trainer group per node, one rollout group per replica, and the
    groups of every other pool verl builds from the config (reward model, teacher)."""
    t_nodes, t_per = int(select(cfg, "trainer.nnodes")), int(select(cfg, "trainer.n_gpus_per_node"))
    r_nodes, r_per = int(select(cfg, "rollout.nnodes")), int(select(cfg, "rollout.n_gpus_per_node"))
    # size_field/count_field name the spec fields behind a group, so that admission can say
    # which field to change (and to what) when a shape can never fit the cluster.
    trainer = [
        Group(
            "trainer",
            t_per,
            float(CPUS_PER_TRAINER_ACCELERATOR * t_per),
            size_field="resources.n_gpus_training",
            count_field="resources.n_nodes_train",
        )
    ] * t_nodes
    size = rollout_replica_size(cfg)
    if size <= r_per:  # one group per replica, wherever it fits
        replica = Group("rollout", size, float(CPUS_PER_ROLLOUT_ACCELERATOR * size))
        rollout = [replica] * (r_nodes * r_per // size)
    else:  # replicas that span whole nodes: what each node must hold
        per_node = Group(
            "rollout",
            r_per,
            float(CPUS_PER_ROLLOUT_ACCELERATOR * r_per),
            size_field="resources.n_gpus_rollout",
            count_field="resources.n_nodes_rollout",
        )
        rollout = [per_node] * r_nodes
    return ResourceShape(
        accelerator=RAY_RESOURCE[accelerator],
        groups=(*trainer, *rollout, *pools.groups(cfg)),
        driver_cpus=float(DRIVER_CPUS),
    )


def planned_syncs(cfg: dict[str, Any]) -> int | None:
    """Parameter syncs the run will make: its progress is the parameter version against this.

    ``total_rollout_steps / (ppo_mini_batch_size * require_batches * trigger_parameter_sync_step)``
    """
    per_sync = samples_per_sync(cfg)
    total = select(cfg, "rollout.total_rollout_steps")
    ok = per_sync is not None and isinstance(total, int) and total > 0
    return total // per_sync if ok else None


def samples_per_sync(cfg: dict[str, Any]) -> int | None:
    """The rollout samples one parameter sync consumes."""
    per_sync = 1
    for key in (
        "actor_rollout_ref.actor.ppo_mini_batch_size",
        "async_training.require_batches",
        "async_training.trigger_parameter_sync_step",
    ):
        value = select(cfg, key)
        if not isinstance(value, int) or value < 1:
            return None
        per_sync *= value
    return per_sync


def spec_keys() -> dict[str, Loc]:
    """Every verl key a spec field maps to, with that field's path."""
    out: dict[str, Loc] = {f"{k}": ("resources", f) for k, f in RESOURCE_KEYS.items()}

    def walk(model: type[BaseModel], prefix: str, loc: Loc) -> None:
        for name, key, _ in _keyed(model, prefix):
            sub = model.model_fields[name].annotation
            if isinstance(sub, type) and issubclass(sub, Block):
                walk(sub, key, (*loc, name))
            else:
                out[key] = (*loc, name)

    for block in VerlFullyAsyncSpec.BLOCKS:
        model = VerlFullyAsyncSpec.model_fields[block].annotation
        assert isinstance(model, type)
        assert issubclass(model, Block)
        walk(model, model.prefix, (block,))
    return out

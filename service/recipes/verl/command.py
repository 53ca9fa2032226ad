"""A resolved spec as verl sees it: the Hydra overrides (each with the spec field it came from),
the argv of verl's fully async entry point, the job's runtime env, and what it holds on Ray."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import Any, Literal

from pydantic import BaseModel

from jobs import samples as job_samples
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
# verl's V1 trainer (trainer_mode separate_async): its main entry point and config.
V1_MODULE = "verl.trainer.main_ppo"
V1_CONFIG_NAMES = {"megatron": "ppo_megatron_trainer"}
V1_DEFAULT_CONFIG = "ppo_trainer"
# The keys the service sets for the V1 trainer (the spec's trainer_mode owns them).
V1_KEYS = {"trainer.use_v1": True, "trainer.v1.trainer_mode": "separate_async"}

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
# The V1 trainer sizes its standalone rollout pool under actor_rollout_ref.rollout.
V1_RESOURCE_KEYS = {
    "trainer.nnodes": "n_nodes_train",
    "trainer.n_gpus_per_node": "n_gpus_training",
    "actor_rollout_ref.rollout.nnodes": "n_nodes_rollout",
    "actor_rollout_ref.rollout.n_gpus_per_node": "n_gpus_rollout",
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


def is_v1(spec: VerlFullyAsyncSpec) -> bool:
    return spec.trainer_mode == "separate_async"


def samples_env(spec: VerlFullyAsyncSpec, cfg: dict[str, Any]) -> dict[str, str]:
    """The variables that start the job's sample shipper (``jobs.samples``): the directory verl
    writes (as composed: an override may have moved it), how much to ship, and the env names
    whose values are masked."""
    directory = (cfg.get("trainer") or {}).get("rollout_data_dir")
    if not spec.samples.enabled or not isinstance(directory, str) or not directory:
        return {}
    return job_samples.env(directory, spec.samples.every, spec.samples.per_step, spec.secrets)


def config_name(spec: VerlFullyAsyncSpec) -> str:
    if is_v1(spec):
        return V1_CONFIG_NAMES.get(spec.actor.strategy, V1_DEFAULT_CONFIG)
    return CONFIG_NAMES.get(spec.actor.strategy, DEFAULT_CONFIG)


def resource_keys(spec: VerlFullyAsyncSpec) -> dict[str, str]:
    """The verl keys the ``resources`` block sets, for the spec's trainer."""
    return V1_RESOURCE_KEYS if is_v1(spec) else RESOURCE_KEYS


def rollout_pool(v1: bool) -> tuple[str, str]:
    """The keys of the rollout pool's nodes and accelerators per node."""
    prefix = "actor_rollout_ref.rollout" if v1 else "rollout"
    return f"{prefix}.nnodes", f"{prefix}.n_gpus_per_node"


def unread_fields(spec: VerlFullyAsyncSpec) -> list[tuple[Loc, str]]:
    """(field path, why) for each field the spec sets that its trainer does not read."""
    out: list[tuple[Loc, str]] = []
    if is_v1(spec):
        for name in sorted(spec.async_training.model_fields_set):
            out.append((("async_training", name), "the V1 trainer (trainer_mode separate_async) "
                        "has no async_training; its keys are in the v1 block "
                        "(v1.parameter_sync_step, v1.max_off_policy_threshold)"))  # fmt: skip
        if "total_rollout_steps" in spec.rollout.model_fields_set:
            out.append((("rollout", "total_rollout_steps"), "the V1 trainer's length is "
                        "trainer.total_training_steps (or trainer.total_epochs)"))  # fmt: skip
        if "gen_batch_size" in spec.data.model_fields_set:
            out.append((("data", "gen_batch_size"), "the V1 trainer samples data.train_batch_size "
                        "prompts a step; gen_batch_size is fully_async_policy's"))  # fmt: skip
    else:
        for name in sorted(spec.v1.model_fields_set):
            out.append((("v1", name), "read only by the V1 trainer: set trainer_mode to "
                        "separate_async, or use the async_training block"))  # fmt: skip
    return out


def overrides(spec: VerlFullyAsyncSpec, checkpoint_dir: str) -> list[Item]:
    """Every override the spec sets, in the launch script's block order, then ``overrides``."""
    return [*field_overrides(spec, checkpoint_dir), *user_overrides(spec)]


def user_overrides(spec: VerlFullyAsyncSpec) -> list[Item]:
    """The spec's own ``overrides``, each under its index."""
    return [Item(text, ("overrides", i)) for i, text in enumerate(spec.overrides)]


def field_overrides(spec: VerlFullyAsyncSpec, checkpoint_dir: str) -> list[Item]:
    """The overrides the spec's fields set, in the launch script's block order."""
    items: list[Item] = []
    v1 = is_v1(spec)
    for block in spec.BLOCKS:
        model = getattr(spec, block)
        if (block == "async_training" and v1) or (block == "v1" and not v1):
            continue  # refused by name when set (unread_fields)
        _walk(model, type(model).prefix, (block,), items, skip=V0_KEYS if v1 else frozenset())
        if block == "data" and v1 and "train_batch_size" not in spec.data.model_fields_set:
            # V1 trains parameter_sync_step mini-batches a step: the batch follows from them.
            batch = spec.v1.parameter_sync_step * spec.actor.ppo_mini_batch_size
            items.append(Item(f"data.train_batch_size={batch}", ("data", "train_batch_size")))
        if block == "trainer":
            if v1:
                for key, value in V1_KEYS.items():
                    items.append(Item(f"{key}={hydra_value(value, ('trainer_mode',))}",
                                      ("trainer_mode",)))  # fmt: skip
            for key, field in resource_keys(spec).items():
                value = getattr(spec.resources, field)
                if field == "accelerator":
                    value = DEVICE[value]
                loc = ("resources", field)
                items.append(Item(f"{key}={hydra_value(value, loc)}", loc))
            if spec.samples.enabled:  # in the run's own dir, on the trainer's node
                at: Loc = ("samples",)
                where = f"{checkpoint_dir}/{job_samples.SUBDIR}"
                items.append(Item(f"trainer.rollout_data_dir={hydra_value(where, at)}", at))
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


# Keys always passed to fully_async_policy that the V1 trainer sets otherwise or lacks.
V0_KEYS = frozenset({"data.train_batch_size", "data.gen_batch_size"})


def _walk(
    model: BaseModel, prefix: str, loc: Loc, out: list[Item], skip: frozenset[str] = frozenset()
) -> None:
    for name, key, always in _keyed(type(model), prefix):
        if name not in model.model_fields_set and (not always or key in skip):
            continue
        value = getattr(model, name)
        if isinstance(value, Block):
            _walk(value, key, (*loc, name), out, skip)
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
        V1_MODULE if is_v1(spec) else MODULE,
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


def with_env(runtime_env: dict[str, Any], more: dict[str, str]) -> dict[str, Any]:
    return {**runtime_env, "env_vars": {**runtime_env["env_vars"], **more}} if more else runtime_env


def rollout_replica_size(cfg: dict[str, Any]) -> int:
    return pools.replica_size(cfg, "actor_rollout_ref.rollout")


def shape(cfg: dict[str, Any], accelerator: str, v1: bool = False) -> ResourceShape:
    """What the run holds: one trainer group per node, one rollout group per replica, and the
    groups of every other pool verl builds from the config (reward model, teacher)."""
    t_nodes, t_per = int(select(cfg, "trainer.nnodes")), int(select(cfg, "trainer.n_gpus_per_node"))
    nodes_key, per_key = rollout_pool(v1)
    r_nodes, r_per = int(select(cfg, nodes_key)), int(select(cfg, per_key))
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


def planned_syncs(cfg: dict[str, Any], v1: bool = False) -> int | None:
    """Parameter syncs the run will make: its progress is the parameter version against this.

    ``total_rollout_steps / (ppo_mini_batch_size * require_batches * trigger_parameter_sync_step)``;
    the V1 trainer syncs once per trainer step: ``trainer.total_training_steps`` when set (else
    only the job knows: its data's size x epochs / train_batch_size).
    """
    if v1:
        steps = select(cfg, "trainer.total_training_steps")
        return steps if isinstance(steps, int) and not isinstance(steps, bool) else None
    per_sync = samples_per_sync(cfg)
    total = select(cfg, "rollout.total_rollout_steps")
    ok = per_sync is not None and isinstance(total, int) and total > 0
    return total // per_sync if ok else None


def samples_per_sync(cfg: dict[str, Any], v1: bool = False) -> int | None:
    """The rollout samples one parameter sync consumes (fully_async_policy: the job may plan
    fewer syncs than the spec, see recovery.ending; V1 plans by trainer steps)."""
    if v1:
        return None
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
    out: dict[str, Loc] = {
        k: ("resources", f) for k, f in (RESOURCE_KEYS | V1_RESOURCE_KEYS).items()
    }
    out |= {k: ("trainer_mode",) for k in V1_KEYS}

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

"""The rules verl enforces at run time, checked on the composed config at submit time, and the
traps that deserve a warning. Each error names the spec field that set the offending key."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from service.errors import field_error
from service.recipes.verl import pools, retiring
from service.recipes.verl.command import (
    DEVICE,
    V1_KEYS,
    is_v1,
    resource_keys,
    rollout_pool,
    rollout_replica_size,
)
from service.recipes.verl.hydra_check import select
from service.recipes.verl.overrides import Loc, Override
from service.recipes.verl.spec import VerlFullyAsyncSpec

LOGGERS = {
    "console", "wandb", "mlflow", "swanlab", "vemlp_wandb", "tensorboard", "clearml", "trackio",
    "file", "rl_insight",
}  # fmt: skip
CREDENTIAL_FREE_LOGGERS = {"console", "tensorboard", "file"}
RS_OPTIONS = {
    "token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
    "seq_mean_k1", "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3",
}  # fmt: skip
ROLLOUT_ENGINES = {"npu": {"vllm"}, "gpu": {"vllm", "sglang", "trtllm"}, "cpu": {"vllm"}}
RC = "algorithm.rollout_correction"


class Locator:
    """Maps a verl key to the spec field that set it last (or that would set it)."""

    def __init__(self, items: list[Override], spec_keys: dict[str, Loc]) -> None:
        self.items = items
        self.spec_keys = spec_keys
        self._last = [(item.key, item.loc) for item in reversed(items) if item.key is not None]

    def set_by(self, key: str) -> Loc | None:
        for k, loc in self._last:
            if k == key or key.startswith(k + "."):
                return loc
        return None

    def __call__(self, key: str) -> Loc:
        return self.set_by(key) or self.spec_keys.get(key) or ("overrides",)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def check(
    cfg: dict[str, Any], spec: VerlFullyAsyncSpec, where: Locator, configured_loggers: list[str]
) -> tuple[list[dict[str, Any]], list[str]]:
    """Errors (422 entries) and warnings for a composed config."""
    errors: list[dict[str, Any]] = []
    accel = spec.resources.accelerator
    v1 = is_v1(spec)
    owner = resource_keys(spec)

    def get(key: str, default: Any = None) -> Any:
        return select(cfg, key, default)

    def err(key: str, msg: str) -> None:
        errors.append(field_error(where(key), f"{key}: {msg}", "verl_rule"))

    def need(key: str, ok: Callable[[Any], bool], msg: str) -> None:
        if not ok(get(key)):
            err(key, f"{msg} (got {get(key)!r})")

    for item in where.items:
        key = item.key
        if item.loc[0] == "overrides" and key is not None:
            owned = [k for k in owner if k == key or k.startswith(key + ".")]
            if owned:
                fields = ", ".join(f"resources.{owner[k]}" for k in owned)
                errors.append(field_error(item.loc, f"{key} is set by {fields}", "verl_rule"))

    if v1:
        _check_v1(get, err)
        need(
            "actor_rollout_ref.hybrid_engine",
            lambda v: v is False,
            "must be False: the service runs V1's standalone rollout pool only",
        )
    else:
        need("data.train_batch_size", lambda v: v == 0, "fully async requires 0")
        need("data.gen_batch_size", lambda v: v == 1, "fully async requires 1")
        need("actor_rollout_ref.hybrid_engine", lambda v: v is False, "fully async requires False")
    need("actor_rollout_ref.rollout.mode", lambda v: v == "async", "must be async")
    need("actor_rollout_ref.rollout.calculate_log_probs", lambda v: v is True, "must be True")
    engines = ROLLOUT_ENGINES[accel]
    need(
        "actor_rollout_ref.rollout.name",
        lambda v: v in engines,
        f"on {accel} one of {sorted(engines)}",
    )
    if not v1:
        need(
            "async_training.staleness_threshold",
            lambda v: _num(v) is not None and v >= 0,
            "must be >= 0",
        )
        need(
            "async_training.trigger_parameter_sync_step",
            lambda v: (_int(v) or 0) >= 1,
            "must be >= 1",
        )
        need("async_training.require_batches", lambda v: (_int(v) or 0) >= 1, "must be >= 1")
    need("ray_kwargs.ray_init", lambda v: isinstance(v, dict), "must be a mapping")
    need("ray_kwargs.ray_init.num_cpus", lambda v: v is None, "must stay null inside a Ray job")
    need("trainer.device", lambda v: v == DEVICE[accel], f"must be {DEVICE[accel]} on {accel}")
    for key in ("data.train_files", "data.val_files", "actor_rollout_ref.model.path"):
        if where.set_by(key) is None:
            err(key, "must be set (verl's default is a placeholder path)")
    if v1:
        pass  # its length: trainer.total_training_steps, or the data's size x total_epochs
    elif where.set_by("rollout.total_rollout_steps") is None:
        err("rollout.total_rollout_steps", "must be set (the total number of prompts to roll out)")
    else:
        need("rollout.total_rollout_steps", lambda v: (_int(v) or 0) >= 1, "must be a count >= 1")
    _check_parallelism(get, err, v1)
    for key, msg in pools.problems(cfg):
        err(key, msg)
    _check_rollout_correction(get, err)
    _check_logger(get, err)
    if errors:
        return errors, []
    return [], _warnings(get, spec, configured_loggers, where.items)


V1 = "trainer.v1"
SYNC_STEP = f"{V1}.separate_async.parameter_sync_step"
OFF_POLICY = f"{V1}.sampler.max_off_policy_threshold"


def _check_v1(get: Callable[..., Any], err: Callable[[str, str], None]) -> None:
    """What verl 0.9.1's V1 trainer asserts at start (trainer_separate_async.py,
    replay_buffer.py), checked here instead."""
    for key, value in V1_KEYS.items():
        if get(key) != value:
            err(key, f"must be {value!r} with trainer_mode separate_async (got {get(key)!r})")
    sync = _int(get(SYNC_STEP))
    mini = _int(get("actor_rollout_ref.actor.ppo_mini_batch_size"))
    if sync is None or sync < 1:
        err(SYNC_STEP, f"must be an integer >= 1 (got {get(SYNC_STEP)!r})")
    elif mini is not None and get("data.train_batch_size") != sync * mini:
        err(
            "data.train_batch_size",
            f"must equal parameter_sync_step x ppo_mini_batch_size = {sync} x {mini} = "
            f"{sync * mini} in separate async training (got {get('data.train_batch_size')!r})",
        )
    threshold = get(OFF_POLICY)
    if threshold is not None and (_int(threshold) or 0) < 1:
        err(OFF_POLICY, f"must be null or an integer >= 1 (got {threshold!r})")
    strategy = f"{V1}.sampler.max_off_policy_strategy"
    if get(strategy) not in ("drop", "wait"):
        err(strategy, f"must be drop or wait (got {get(strategy)!r})")
    backend = "actor_rollout_ref.rollout.checkpoint_engine.backend"
    if get(backend) == "naive":
        err(
            backend,
            "separate async training cannot sync weights with the naive engine (it needs the "
            "trainer and rollout colocated): use nccl, hccl, nixl, mooncake or a custom backend",
        )


def _check_parallelism(
    get: Callable[..., Any], err: Callable[[str, str], None], v1: bool = False
) -> None:
    for key in ("trainer.nnodes", "trainer.n_gpus_per_node", *rollout_pool(v1)):
        if (_int(get(key)) or 0) < 1:
            err(key, f"must be a positive integer (got {get(key)!r})")
            return
    world = get("trainer.nnodes") * get("trainer.n_gpus_per_node")
    actor = "actor_rollout_ref.actor"
    if get(f"{actor}.strategy") == "megatron":
        parts = (
            "tensor_model_parallel_size",
            "pipeline_model_parallel_size",
            "context_parallel_size",
        )
        keys = [f"{actor}.megatron.{p}" for p in parts]
    else:
        keys = [f"{actor}.ulysses_sequence_parallel_size"]
    model_parallel = 1
    for key in keys:
        size = _int(get(key, 1))
        if size is None or size < 1:
            err(key, f"must be a positive integer (got {get(key)!r})")
            return
        model_parallel *= size
    if world % model_parallel:
        err(
            keys[0],
            f"model-parallel size {model_parallel} does not divide {world} trainer accelerators",
        )
        return
    dp = world // model_parallel
    mini, n = _int(get(f"{actor}.ppo_mini_batch_size")), _int(get("actor_rollout_ref.rollout.n"))
    if mini is None or n is None or mini < 1 or n < 1:
        err(
            f"{actor}.ppo_mini_batch_size",
            "ppo_mini_batch_size and rollout.n must be positive integers",
        )
    elif (mini * n) % dp:
        err(
            f"{actor}.ppo_mini_batch_size",
            f"ppo_mini_batch_size x rollout.n = {mini * n} is not divisible by the trainer's "
            f"data-parallel size {dp}",
        )
    rollout = "actor_rollout_ref.rollout"
    for part in pools.REPLICA_PARTS:
        if (_int(get(f"{rollout}.{part}", 1)) or 0) < 1:
            err(f"{rollout}.{part}", "must be a positive integer")
            return
    replica = rollout_replica_size({"actor_rollout_ref": {"rollout": get(rollout)}})
    nodes_key, per_key = rollout_pool(v1)
    per_node = get(per_key)
    r_world = get(nodes_key) * per_node
    if r_world % replica:
        err(
            f"{rollout}.tensor_model_parallel_size",
            f"a rollout replica of {replica} accelerators (TP x DP x PP) does not divide the "
            f"{r_world} rollout accelerators",
        )
    elif per_node % replica if replica <= per_node else replica % per_node:
        err(
            f"{rollout}.tensor_model_parallel_size",
            f"rollout replicas of {replica} accelerators (TP x DP x PP) do not tile nodes of "
            f"{per_node}: a replica must divide a node's share, or span whole nodes",
        )


def _check_rollout_correction(get: Callable[..., Any], err: Callable[[str, str], None]) -> None:
    rollout_is = get(f"{RC}.rollout_is")
    if rollout_is not in (None, "token", "sequence"):
        err(f"{RC}.rollout_is", f"must be null, token or sequence (got {rollout_is!r})")
    if rollout_is is not None and not _threshold_ok(get(f"{RC}.rollout_is_threshold"), pair=True):
        err(f"{RC}.rollout_is_threshold", "must be a positive number or 'lower_upper'")
    rs = get(f"{RC}.rollout_rs")
    if rs is None:
        return
    options = [o.strip() for o in rs.split(",") if o.strip()] if isinstance(rs, str) else []
    bad = [o for o in options if o not in RS_OPTIONS]
    if not options or bad:
        err(
            f"{RC}.rollout_rs",
            f"must be a comma-separated subset of {sorted(RS_OPTIONS)} (got {rs!r}); "
            "geometric rejection sampling is seq_mean_k1",
        )
        return
    spec = get(f"{RC}.rollout_rs_threshold")
    raw = (
        [str(spec)]
        if _num(spec) is not None
        else ([p.strip() for p in spec.split(",") if p.strip()] if isinstance(spec, str) else [])
    )
    if not raw or len(raw) not in (1, len(options)):
        err(
            f"{RC}.rollout_rs_threshold",
            f"needs one threshold, or one per rollout_rs option ({len(options)}), got {spec!r}",
        )
        return
    for option, text in zip(options, raw * len(options) if len(raw) == 1 else raw, strict=False):
        if not _threshold_ok(text, pair=option.endswith("k1")):
            form = (
                "'lower_upper' or one positive number"
                if option.endswith("k1")
                else "one positive number"
            )
            err(f"{RC}.rollout_rs_threshold", f"{option} needs {form}, got {text!r}")
            return


def _threshold_ok(spec: Any, pair: bool) -> bool:
    if _num(spec) is not None:
        return float(spec) > 0
    if not isinstance(spec, str):
        return False
    parts = spec.split("_", 1) if pair else [spec]
    if not pair and "_" in spec:
        return False
    try:
        values = [float(p) for p in parts]
    except ValueError:
        return False
    return all(v > 0 for v in values) and (len(values) == 1 or values[0] <= values[1])


def _check_logger(get: Callable[..., Any], err: Callable[[str, str], None]) -> None:
    logger = get("trainer.logger")
    names = [logger] if isinstance(logger, str) else logger if isinstance(logger, list) else None
    if names is None or not all(isinstance(n, str) for n in names):
        err("trainer.logger", f"must be a list of backend names (got {logger!r})")
        return
    unknown = sorted(set(names) - LOGGERS)
    if unknown:
        err("trainer.logger", f"unknown backend(s) {unknown}; known: {sorted(LOGGERS)}")
    elif "console" not in names:
        err(
            "trainer.logger", "must include console: the service reads metrics from the console log"
        )


def _warnings(
    get: Callable[..., Any],
    spec: VerlFullyAsyncSpec,
    configured_loggers: list[str],
    where_items: list[Override],
) -> list[str]:
    v1 = is_v1(spec)
    out: list[str] = [] if v1 else [retiring.warning(get)]
    if (
        get(f"{RC}.rollout_is") is not None
        and get(f"{RC}.bypass_mode") is True
        and get(f"{RC}.loss_type") == "ppo_clip"
    ):
        out.append(
            "algorithm.rollout_correction: with bypass_mode=True and loss_type=ppo_clip the "
            "rollout_is weights are only reported as metrics, not applied to the loss; set "
            "bypass_mode=False or loss_type=reinforce to train with them"
        )
    sync = _int(get("async_training.trigger_parameter_sync_step")) or 1
    optim = "actor_rollout_ref.actor.optim"
    scheduled = (
        (_num(get(f"{optim}.lr_warmup_steps")) or 0) > 0
        or (_num(get(f"{optim}.lr_warmup_steps_ratio")) or 0) > 0
        or get(f"{optim}.lr_scheduler_type", "constant") not in (None, "constant")
        or get(f"{optim}.lr_decay_style", "constant") not in (None, "constant")
    )
    if sync > 1 and scheduled and not v1:  # V1 scales the schedule by parameter_sync_step
        out.append(
            f"actor.optim: a learning-rate warmup/decay schedule advances {sync}x too fast under "
            f"trigger_parameter_sync_step={sync} (its length counts weight syncs, it steps every "
            "trainer step); scale its steps or use a constant rate"
        )
    logger = get("trainer.logger")
    missing = sorted(
        n
        for n in (logger if isinstance(logger, list) else [logger])
        if n not in CREDENTIAL_FREE_LOGGERS and n not in configured_loggers
    )
    if missing and not spec.secrets:  # credentials named as secrets count as given
        out.append(
            f"trainer.logger: {missing} need credentials this deployment has not configured; "
            'name them as secrets the service holds (e.g. "secrets": {"WANDB_API_KEY": '
            '"wandb-team-key"}) or the run may fail at start'
        )
    if any(item.key == "rollout.n" for item in where_items):
        out.append(
            "rollout.n (top level) is unused by verl; responses per prompt are "
            "actor_rollout_ref.rollout.n (the spec's rollout.n)"
        )
    out += _resume_warnings(get, v1)
    return out


def _resume_warnings(get: Callable[..., Any], v1: bool = False) -> list[str]:
    """Combinations verl 0.9.1's resume is known to lose work with, as its source and a real
    run (a cpu-smoke trainer SIGKILLed after its second checkpoint, with ``async_save`` asked
    for) show them."""
    out: list[str] = []
    resume = get("trainer.resume_mode")
    if get("actor_rollout_ref.actor.checkpoint.async_save") is True:
        if v1:
            if resume == "auto":
                out.append(
                    "actor.checkpoint.async_save with trainer.resume_mode=auto: verl 0.9.1's V1 "
                    "trainer then skips latest_checkpointed_iteration.txt, so its own auto "
                    "resume finds no checkpoint and restarts from step 0 (verl #7952); the "
                    "service's later attempts resume from the newest complete global_step_N by "
                    "resume_from_path, a restart by hand does not"
                )
        elif get("actor_rollout_ref.actor.strategy") in ("fsdp", "fsdp2"):
            out.append(
                "actor.checkpoint.async_save has no effect with the FSDP strategies in verl "
                "0.9.1 (Megatron only): the saves stay synchronous and the fully async trainer "
                "writes latest_checkpointed_iteration.txt after each, so resume works as "
                "without it (verl #7952, a restart from step 0, is its other trainers', which "
                "skip the tracker)"
            )
        elif resume == "auto":
            out.append(
                "actor.checkpoint.async_save with trainer.resume_mode=auto: verl 0.9.1's fully "
                "async trainer writes latest_checkpointed_iteration.txt once it has asked for "
                "the save (its other trainers skip it and restart from step 0, verl #7952), so "
                "a failure during a save leaves the tracker naming an incomplete "
                "global_step_N, which verl's own resume loads; the service's later attempts "
                "resume from the newest complete one (resume_from_path), a restart by hand "
                "does not"
            )
    sync = _int(get("async_training.trigger_parameter_sync_step")) or 1
    if resume in ("auto", "resume_path") and not v1:
        out.append(
            f"trainer.resume_mode={resume}: verl 0.9.1's fully async trainer, resumed from "
            f"global_step_N, labels its first step N x {sync} + 2 (verl #7933), so "
            "training/global_step skips one there; the logged steps (parameter versions) go "
            "on from N + 1 and no step is trained twice, but the training figures a failed "
            "attempt had not printed yet (verl prints a step's one sync late) are lost"
        )
    return out

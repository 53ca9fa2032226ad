"""The ``verl-fully-async`` run spec: blocks that mirror verl's fully async launch script.

Each field maps to one verl Hydra key (the block's prefix plus the field name, unless the field
names its own ``verl_key``). Defaults are verl's; only fields a request (or its preset) sets are
passed to verl, so an unset field keeps verl's value. ``None`` sent explicitly becomes ``null``.
Fields marked ``always`` carry values fully async requires and are always passed.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
)

from service.recipes import env_names
from service.recipes.base import RunSpec
from service.recipes.verl.guard import pip_refusal

# Environment variables the service owns, and the setting that decides each.
SERVICE_ENV = {"RAY_JOB_STOP_WAIT_TIME_S": "RLRUN_STOP_GRACE_S, the time a stopped run has"}
# Files that travel with a run (its working directory on every node): names, count and sizes.
FILE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}$")
MAX_FILES = 16
MAX_FILE_BYTES = 64 * 1024
MAX_FILES_BYTES = 256 * 1024
# How many overrides a spec may carry, and how long each may be.
MAX_OVERRIDES = 200
MAX_OVERRIDE_CHARS = 2000


def V(default: Any = None, *, key: str | None = None, always: bool = False, **kw: Any) -> Any:
    """A spec field with its verl key (if not prefix + name) and whether it is always passed."""
    extra: dict[str, Any] = {k: v for k, v in (("verl_key", key), ("always", always)) if v}
    return Field(default=default, json_schema_extra=extra or None, **kw)


class OnlySet(BaseModel):
    """Serializes only the fields that were set, so a stored spec resubmits to the same run."""

    model_config = ConfigDict(extra="forbid")
    KEEP: ClassVar[frozenset[str]] = frozenset()

    @model_serializer(mode="wrap")
    def _only_set(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        return {k: v for k, v in data.items() if k in self.model_fields_set or k in self.KEEP}


class Block(OnlySet):
    """A group of verl keys under ``prefix``."""

    prefix: ClassVar[str] = ""


class DataSpec(Block):
    prefix: ClassVar[str] = "data"
    train_files: str | list[str] | None = V(description="parquet file(s) on the cluster")
    val_files: str | list[str] | None = V(description="parquet file(s) on the cluster")
    train_batch_size: int = V(0, always=True, description="fully async requires 0")
    gen_batch_size: int = V(1, always=True, description="fully async requires 1")
    max_prompt_length: int = V(512, ge=1)
    max_response_length: int = V(512, ge=1)
    filter_overlong_prompts: bool = V(False)
    truncation: Literal["error", "left", "right", "middle"] = V("error")
    image_key: str = V("images")
    prompt_key: str = V("prompt")
    shuffle: bool = V(True)
    return_raw_chat: bool = V(True)


class ModelSpec(Block):
    prefix: ClassVar[str] = "actor_rollout_ref.model"
    path: str | None = V(description="Hugging Face model directory on the cluster (or hub id)")
    use_remove_padding: bool = V(True)
    use_fused_kernels: bool = V(False)
    enable_gradient_checkpointing: bool = V(True)
    enable_activation_offload: bool = V(False)
    trust_remote_code: bool = V(False)


class OptimSpec(Block):
    lr: float = V(1e-6, gt=0)
    lr_warmup_steps: int = V(-1, ge=-1)
    lr_warmup_steps_ratio: float = V(0.0, ge=0, le=1)
    lr_scheduler_type: Literal["constant", "cosine"] = V("constant")
    weight_decay: float = V(0.01, ge=0)
    min_lr_ratio: float = V(0.0, ge=0, le=1)
    lr_decay_steps: int | None = V(None, ge=1, description="Megatron optimizer only")
    lr_decay_style: str | None = V(None, description="Megatron optimizer only")


class FsdpSpec(Block):
    strategy: Literal["fsdp", "fsdp2"] = V("fsdp")
    reshard_after_forward: bool = V(True)
    forward_prefetch: bool = V(False)
    entropy_checkpointing: bool | None = V(None, description="default: the actor's")
    param_offload: bool = V(False)
    optimizer_offload: bool = V(False)
    fsdp_size: int = V(-1, ge=-1)


class MegatronSpec(Block):
    tensor_model_parallel_size: int = V(1, ge=1)
    pipeline_model_parallel_size: int = V(1, ge=1)
    context_parallel_size: int = V(1, ge=1)
    expert_model_parallel_size: int = V(1, ge=1)
    expert_tensor_parallel_size: int | None = V(None, ge=1)
    param_offload: bool = V(False)
    optimizer_offload: bool = V(False)
    use_mbridge: bool = V(True)
    use_dist_checkpointing: bool = V(False)


class RefMegatronSpec(Block):
    """The reference model's Megatron layout; unset fields follow the actor's."""

    tensor_model_parallel_size: int | None = V(None, ge=1)
    pipeline_model_parallel_size: int | None = V(None, ge=1)
    context_parallel_size: int | None = V(None, ge=1)
    expert_model_parallel_size: int | None = V(None, ge=1)
    param_offload: bool | None = V(None)
    use_dist_checkpointing: bool | None = V(None)


LossAgg = Literal[
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
]


class ActorSpec(Block):
    prefix: ClassVar[str] = "actor_rollout_ref.actor"
    hybrid_engine: bool = V(
        False, key="actor_rollout_ref.hybrid_engine", always=True, description="must be false"
    )
    strategy: Literal["fsdp", "fsdp2", "megatron"] = V(
        "fsdp", description="megatron selects verl's fully_async_ppo_megatron_trainer config"
    )
    optim: OptimSpec = Field(default_factory=OptimSpec)
    ppo_mini_batch_size: int = V(256, ge=1)
    use_dynamic_bsz: bool = V(False)
    ppo_max_token_len_per_gpu: int = V(16384, ge=1)
    ppo_micro_batch_size_per_gpu: int | None = V(None, ge=1)
    use_kl_loss: bool = V(False)
    kl_loss_coef: float = V(0.001, ge=0)
    kl_loss_type: str = V("low_var_kl")
    entropy_coeff: float = V(0.0)
    entropy_from_logits_with_chunking: bool = V(False)
    clip_ratio_low: float = V(0.2, ge=0)
    clip_ratio_high: float = V(0.2, ge=0)
    clip_ratio_c: float = V(3.0, gt=1)
    loss_agg_mode: LossAgg = V("token-mean")
    grad_clip: float = V(1.0, ge=0)
    ulysses_sequence_parallel_size: int = V(1, ge=1)
    use_torch_compile: bool = V(True)
    fsdp_config: FsdpSpec = Field(default_factory=FsdpSpec)
    megatron: MegatronSpec = Field(default_factory=MegatronSpec)


class RefSpec(Block):
    prefix: ClassVar[str] = "actor_rollout_ref.ref"
    fsdp_config: FsdpSpec = Field(default_factory=FsdpSpec)
    megatron: RefMegatronSpec = Field(default_factory=RefMegatronSpec)
    log_prob_micro_batch_size_per_gpu: int | None = V(None, ge=1)
    log_prob_use_dynamic_bsz: bool | None = V(None, description="default: the actor's")
    log_prob_max_token_len_per_gpu: int | None = V(None, ge=1, description="default: the actor's")
    ulysses_sequence_parallel_size: int | None = V(None, ge=1, description="default: the actor's")
    use_torch_compile: bool | None = V(None, description="default: the actor's")


class ValKwargsSpec(Block):
    temperature: float = V(0.0, ge=0)
    top_p: float = V(1.0, gt=0, le=1)
    top_k: int = V(-1, ge=-1)
    do_sample: bool = V(False)
    n: int = V(1, ge=1)


class RolloutSpec(Block):
    prefix: ClassVar[str] = "actor_rollout_ref.rollout"
    name: Literal["vllm", "sglang", "trtllm"] = V("vllm", always=True)
    mode: str = V("async", always=True, description="fully async requires async")
    calculate_log_probs: bool = V(True, always=True, description="fully async requires true")
    n: int = V(1, ge=1, description="responses per prompt (GRPO needs > 1)")
    total_rollout_steps: int | None = V(
        None, key="rollout.total_rollout_steps", ge=1, description="total prompts; required"
    )
    tensor_model_parallel_size: int = V(2, ge=1)
    data_parallel_size: int = V(1, ge=1)
    pipeline_model_parallel_size: int = V(1, ge=1)
    expert_parallel_size: int = V(1, ge=1)
    gpu_memory_utilization: float = V(0.5, gt=0, le=1)
    log_prob_micro_batch_size_per_gpu: int | None = V(None, ge=1)
    log_prob_use_dynamic_bsz: bool | None = V(None, description="default: the actor's")
    log_prob_max_token_len_per_gpu: int | None = V(None, ge=1, description="default: the actor's")
    max_model_len: int | None = V(None, ge=1)
    max_num_batched_tokens: int = V(8192, ge=1)
    max_num_seqs: int = V(256, ge=1)
    enable_chunked_prefill: bool = V(True)
    enable_prefix_caching: bool = V(True)
    free_cache_engine: bool = V(True)
    enforce_eager: bool = V(False)
    temperature: float = V(1.0, ge=0)
    top_p: float = V(1.0, gt=0, le=1)
    top_k: int = V(-1, ge=-1)
    val_kwargs: ValKwargsSpec = Field(default_factory=ValKwargsSpec)


class RolloutCorrectionSpec(Block):
    rollout_is: Literal["token", "sequence"] | None = V(None)
    rollout_is_threshold: float | str = V(2.0)
    rollout_is_batch_normalize: bool = V(False)
    rollout_rs: str | None = V(None, description="comma-separated, e.g. token_k1 or seq_mean_k1")
    rollout_rs_threshold: float | str | None = V(None, description="e.g. 0.6_1.6 for *_k1")
    bypass_mode: bool = V(True, description="fully async default")
    loss_type: Literal["ppo_clip", "reinforce"] = V("ppo_clip")


class KlCtrlSpec(Block):
    kl_coef: float = V(0.001, ge=0)


class AlgorithmSpec(Block):
    prefix: ClassVar[str] = "algorithm"
    adv_estimator: str = V("gae")
    use_kl_in_reward: bool = V(False)
    kl_ctrl: KlCtrlSpec = Field(default_factory=KlCtrlSpec)
    rollout_correction: RolloutCorrectionSpec = Field(default_factory=RolloutCorrectionSpec)


ResumeMode = Literal["auto", "disable", "resume_path"]


class TrainerSpec(Block):
    prefix: ClassVar[str] = "trainer"
    project_name: str = V("verl_examples", min_length=1, max_length=200)
    experiment_name: str = V("gsm8k", min_length=1, max_length=200)
    logger: list[str] = V(["console", "wandb"], min_length=1)
    critic_warmup: int = V(0, ge=0)
    resume_mode: ResumeMode = V("auto")
    resume_from_path: str | None = V(None)
    val_before_train: bool = V(True)
    save_freq: int = V(-1, ge=-1)
    test_freq: int = V(-1, ge=-1)
    total_epochs: int = V(30, ge=1)
    total_training_steps: int | None = V(None, ge=1)
    default_local_dir: str | None = V(
        None, description="checkpoint dir; unset or null: <checkpoint root>/<run id>"
    )
    max_actor_ckpt_to_keep: int | None = V(None, ge=1)
    log_val_generations: int = V(0, ge=0)


class AsyncTrainingSpec(Block):
    prefix: ClassVar[str] = "async_training"
    staleness_threshold: float = V(0.1, ge=0)
    trigger_parameter_sync_step: int = V(4, ge=1)
    require_batches: int = V(1, ge=1)
    partial_rollout: bool = V(True)
    use_trainer_do_validate: bool = V(False)


class V1Spec(Block):
    """verl's V1 trainer (``trainer_mode: separate_async``) only: what takes the place of
    ``async_training``. One weight sync per trainer step; a step trains ``data.train_batch_size
    = parameter_sync_step x actor.ppo_mini_batch_size`` prompts in ``parameter_sync_step``
    updates; staleness is bounded in model versions, not as a share of samples."""

    prefix: ClassVar[str] = "trainer.v1"
    parameter_sync_step: int = V(4, key="trainer.v1.separate_async.parameter_sync_step", ge=1)
    num_warmup_batches: float = V(1, key="trainer.v1.separate_async.num_warmup_batches", ge=0)
    max_off_policy_threshold: int | None = V(
        8,
        key="trainer.v1.sampler.max_off_policy_threshold",
        ge=1,
        description="model versions a trajectory may span; null: no version control",
    )
    max_off_policy_strategy: Literal["drop", "wait"] = V(
        "drop", key="trainer.v1.sampler.max_off_policy_strategy"
    )


# The trainer verl runs: its fully_async_policy entry point (retiring), or its V1 trainer in
# separate_async mode (verl.trainer.main_ppo, trainer.use_v1).
TrainerMode = Literal["fully_async_policy", "separate_async"]


class ResourcesSpec(OnlySet):
    """Accelerator groups: trainer and rollout each on ``n_nodes_*`` nodes x ``n_gpus_*``."""

    # cpu: verl's own trainer on host CPUs (the cpu-smoke preset; docs/guide/verl.md#cpu).
    accelerator: Literal["npu", "gpu", "cpu"] = "npu"
    n_gpus_training: int = Field(default=8, ge=1, le=128)
    n_nodes_train: int = Field(default=1, ge=1, le=1024)
    n_gpus_rollout: int = Field(default=8, ge=1, le=128)
    n_nodes_rollout: int = Field(default=1, ge=1, le=1024)


class RuntimeEnvSpec(OnlySet):
    """The Ray runtime env parts a run may set: environment variables and pip requirements."""

    env_vars: dict[str, str] = Field(default_factory=dict, max_length=200)
    pip: list[str] | None = Field(default=None, max_length=100)

    @field_validator("env_vars")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if not env_names.NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not an environment variable name")
            if name in SERVICE_ENV:
                raise ValueError(f"{name} is set by the service ({SERVICE_ENV[name]})")
        return value

    @field_validator("pip")
    @classmethod
    def _requirements(cls, value: list[str] | None) -> list[str] | None:
        for req in value or []:
            why = pip_refusal(req)
            if why:
                raise ValueError(why)
        return value


class VerlFullyAsyncSpec(RunSpec, OnlySet):
    """A verl fully async GRPO run; ``preset`` fills fields the request leaves out."""

    KEEP: ClassVar[frozenset[str]] = frozenset({"recipe"})

    recipe: Literal["verl-fully-async"] = "verl-fully-async"
    preset: str | None = None
    trainer_mode: TrainerMode = Field(
        default="fully_async_policy",
        description="fully_async_policy: verl's fully_async_main (async_training block); "
        "separate_async: verl's V1 trainer (trainer.use_v1, v1 block)",
    )
    verl_version: str | None = Field(
        default=None,
        pattern=r"^\d+\.\d+\.\d+(?:(?:rc|\.post|\.dev)\d+)?$",
        description="the verl release to validate against (default: the service's); "
        "the nodes must run it",
    )
    data: DataSpec = Field(default_factory=DataSpec)
    model: ModelSpec = Field(default_factory=ModelSpec)
    actor: ActorSpec = Field(default_factory=ActorSpec)
    ref: RefSpec = Field(default_factory=RefSpec)
    rollout: RolloutSpec = Field(default_factory=RolloutSpec)
    algorithm: AlgorithmSpec = Field(default_factory=AlgorithmSpec)
    trainer: TrainerSpec = Field(default_factory=TrainerSpec)
    async_training: AsyncTrainingSpec = Field(default_factory=AsyncTrainingSpec)
    v1: V1Spec = Field(default_factory=V1Spec)
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    runtime_env: RuntimeEnvSpec = Field(default_factory=RuntimeEnvSpec)
    files: dict[str, str] = Field(
        default_factory=dict,
        max_length=MAX_FILES,
        description="small text files shipped with the run (name -> text), e.g. a reward "
        "function, unpacked in run-files/ of the job's working directory (on no import path); "
        "refer to them by name, e.g. custom_reward_function.path=reward.py",
    )
    overrides: list[str] = Field(
        default_factory=list,
        max_length=MAX_OVERRIDES,
        description="any other Hydra override, e.g. 'actor_rollout_ref.rollout.top_p=0.9'",
    )

    @field_validator("files")
    @classmethod
    def _file_sizes(cls, value: dict[str, str]) -> dict[str, str]:
        for name, text in value.items():
            if not FILE_NAME.match(name) or name in (".", ".."):
                raise ValueError(f"{name!r} is not a plain file name (letters, digits, . _ -)")
            if len(text.encode()) > MAX_FILE_BYTES:
                raise ValueError(f"{name} is larger than {MAX_FILE_BYTES // 1024} KiB")
        if sum(len(t.encode()) for t in value.values()) > MAX_FILES_BYTES:
            raise ValueError(f"the files add up to more than {MAX_FILES_BYTES // 1024} KiB")
        return value

    @field_validator("overrides")
    @classmethod
    def _override_lengths(cls, value: list[str]) -> list[str]:
        for item in value:
            if not item or len(item) > MAX_OVERRIDE_CHARS:
                raise ValueError(
                    f"an override is a non-empty string of at most {MAX_OVERRIDE_CHARS} characters"
                )
        return value

    BLOCKS: ClassVar[tuple[str, ...]] = (
        "data",
        "model",
        "actor",
        "ref",
        "rollout",
        "algorithm",
        "trainer",
        "async_training",
        "v1",
    )

"""Presets: named spec bodies that a request starts from; fields in the request replace theirs.

``geo3k-qwen3vl-8b-npu`` is verl's fully async GRPO example for Qwen3-VL-8B on geo3k on Ascend
NPU (``geo3k_qwen3vl_8b_fsdp2_16_16_npu.sh``), override for override. Deliberate differences:
data and model paths come from settings (not ``$HOME``), the checkpoint dir is per run and
absolute (the recipe sets it), ``trainer.device=npu`` (from ``resources``), and the logger list
keeps ``console`` and only those credentialed backends the deployment has configured.

``cpu-smoke`` runs verl's own trainer on CPU with a random tiny model (``cpu_smoke``);
``cpu-learn`` is the seed's recipe in miniature, whose reward rises under GRPO (``cpu_learn``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import PurePosixPath
from typing import Any

from service.settings import Settings

Preset = Callable[[Settings], dict[str, Any]]


def splits(folder: PurePosixPath) -> dict[str, str]:
    """verl's data files where a preset keeps them: ``train.parquet`` and ``test.parquet``."""
    return {"train_files": str(folder / "train.parquet"), "val_files": str(folder / "test.parquet")}


def geo3k_qwen3vl_8b_npu(settings: Settings) -> dict[str, Any]:
    data_dir = PurePosixPath(settings.verl_data_dir)
    configured = set(settings.verl_loggers_configured)
    return {
        "data": {
            **splits(data_dir / "geo3k"),
            "train_batch_size": 0,
            "gen_batch_size": 1,
            "max_prompt_length": 1024,
            "max_response_length": 2048,
            "filter_overlong_prompts": True,
            "truncation": "error",
            "image_key": "images",
            "shuffle": False,
            "return_raw_chat": True,
        },
        "model": {
            "path": str(PurePosixPath(settings.verl_model_dir) / "Qwen3-VL-8B-Instruct"),
            "use_remove_padding": True,
            "use_fused_kernels": False,
            "enable_gradient_checkpointing": True,
            "enable_activation_offload": False,
        },
        "actor": {
            "hybrid_engine": False,
            "optim": {"lr": 1e-6},
            "ppo_mini_batch_size": 64,
            "use_dynamic_bsz": True,
            "ppo_max_token_len_per_gpu": 16384,
            "ppo_micro_batch_size_per_gpu": 1,
            "strategy": "fsdp2",
            "use_kl_loss": True,
            "kl_loss_coef": 0.01,
            "kl_loss_type": "low_var_kl",
            "entropy_coeff": 0,
            "entropy_from_logits_with_chunking": True,
            "fsdp_config": {
                "reshard_after_forward": True,
                "entropy_checkpointing": True,
                "param_offload": False,
                "optimizer_offload": False,
                "forward_prefetch": True,
            },
        },
        "ref": {
            "fsdp_config": {
                "reshard_after_forward": True,
                "forward_prefetch": True,
                "param_offload": False,
            },
            "log_prob_micro_batch_size_per_gpu": 1,
            "log_prob_use_dynamic_bsz": True,
            "log_prob_max_token_len_per_gpu": 16384,
        },
        "rollout": {
            "name": "vllm",
            "mode": "async",
            "tensor_model_parallel_size": 1,
            "gpu_memory_utilization": 0.8,
            "n": 4,
            "calculate_log_probs": True,
            "log_prob_micro_batch_size_per_gpu": 1,
            "log_prob_use_dynamic_bsz": True,
            "log_prob_max_token_len_per_gpu": 16384,
            "max_model_len": 32768,
            "max_num_batched_tokens": 32768,
            "total_rollout_steps": 512 * 100,
        },
        "algorithm": {
            "adv_estimator": "grpo",
            "use_kl_in_reward": False,
            "rollout_correction": {
                "rollout_is": "sequence",
                "rollout_is_threshold": 2.0,
                "rollout_is_batch_normalize": True,
                "rollout_rs": "token_k1",
                "rollout_rs_threshold": "0.6_1.6",
            },
        },
        "trainer": {
            "critic_warmup": 0,
            "logger": ["console", *(b for b in ["wandb"] if b in configured)],
            "project_name": "verl_grpo_example_geo3k",
            "experiment_name": "qwen3_vl_8b_fsdp2_async",
            "resume_mode": "auto",
            "val_before_train": False,
            "save_freq": -1,
            "test_freq": 5,
            "total_epochs": 200,
        },
        "async_training": {
            "staleness_threshold": 0.1,
            "trigger_parameter_sync_step": 4,
            "require_batches": 2,
            "partial_rollout": True,
        },
        "resources": {
            "accelerator": "npu",
            "n_gpus_training": 16,
            "n_nodes_train": 1,
            "n_gpus_rollout": 16,
            "n_nodes_rollout": 1,
        },
        "runtime_env": {"env_vars": {"CUDA_DEVICE_MAX_CONNECTIONS": "1", "VLLM_USE_V1": "1"}},
    }


SMOKE_DIR = "rlrun-smoke"  # under RLRUN_VERL_DATA_DIR: what `rlrun verl make-smoke-assets` writes
# Overrides a CPU run needs that no spec field carries (docs/guide/verl.md#cpu): float32 (vLLM's
# CPU worker dies with SIGILL on bfloat16 here), no CUDA graphs nor sleep mode (vLLM refuses it on
# CPU; the key is a dataclass field verl's YAML lacks, hence +), SDPA attention, and weights
# synced through a file (every built-in checkpoint engine needs CUDA, NCCL/HCCL or RDMA).
CPU_OVERRIDES = [
    "actor_rollout_ref.actor.fsdp_config.dtype=float32",
    "actor_rollout_ref.rollout.dtype=float32",
    "+actor_rollout_ref.rollout.enable_sleep_mode=False",
    "+actor_rollout_ref.rollout.engine_kwargs.vllm.compilation_config.cudagraph_mode=NONE",
    "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
    "actor_rollout_ref.rollout.checkpoint_engine.backend=file",
    "actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=jobs.verl_cpu.weights",
]
SMOKE_SYNCS = 3  # parameter syncs (= trainer steps here): each prompt group of 4 is one
# One agent-loop and one reward-loop worker: verl's default 8 of each are 14 more processes, each
# importing torch (about 0.7 GB apiece), for a run of 4 prompts at a time.
SMOKE_WORKERS = ["actor_rollout_ref.rollout.agent.num_workers=1", "reward.num_workers=1"]


def cpu_smoke(settings: Settings) -> dict[str, Any]:
    """A smoke run of verl's real fully async trainer on CPU: a random tiny Qwen2 (made by
    `rlrun verl make-smoke-assets $RLRUN_VERL_DATA_DIR/rlrun-smoke`), one FSDP2 trainer worker
    and one vLLM rollout replica (one agent-loop and one reward-loop worker), 3 GRPO steps with
    a weight sync and a checkpoint each. It proves the path (launch, metrics, syncs,
    checkpoints, resume), not learning: with random weights every reward is 0."""
    root = PurePosixPath(settings.verl_data_dir) / SMOKE_DIR
    return {
        "data": {
            **splits(root / "data"),
            "max_prompt_length": 64,
            "max_response_length": 16,
            "shuffle": False,
        },
        "model": {
            "path": str(root / "model"),
            "use_remove_padding": False,
            "enable_gradient_checkpointing": False,
        },
        "actor": {
            "strategy": "fsdp2",
            "optim": {"lr": 1e-5},
            "ppo_mini_batch_size": 4,
            "ppo_micro_batch_size_per_gpu": 4,
            "use_kl_loss": False,
            "use_torch_compile": False,
        },
        "rollout": {
            "n": 4,
            "total_rollout_steps": 4 * SMOKE_SYNCS,
            "tensor_model_parallel_size": 1,
            "log_prob_micro_batch_size_per_gpu": 4,
            "max_model_len": 128,
            "max_num_batched_tokens": 1024,
            "enforce_eager": True,
            "free_cache_engine": False,
            "enable_prefix_caching": False,
        },
        "algorithm": {"adv_estimator": "grpo"},
        "trainer": {
            "logger": ["console"],
            "project_name": "rlrun_smoke",
            "experiment_name": "cpu_smoke",
            "resume_mode": "auto",
            "val_before_train": False,
            "save_freq": 1,
            "test_freq": -1,
            "total_epochs": 1,
        },
        "async_training": {
            "staleness_threshold": 0.1,
            "trigger_parameter_sync_step": 1,
            "require_batches": 1,
            "partial_rollout": True,
        },
        "resources": {
            "accelerator": "cpu",
            "n_gpus_training": 1,
            "n_nodes_train": 1,
            "n_gpus_rollout": 1,
            "n_nodes_rollout": 1,
        },
        "overrides": [*CPU_OVERRIDES, *SMOKE_WORKERS],
    }


LEARN_DIR = "rlrun-learn"  # under RLRUN_VERL_DATA_DIR: `rlrun verl make-smoke-assets --learn`
LEARN_SYNCS = 60  # parameter syncs, one GRPO update of 16 prompts x 8 responses each
LEARN_PROMPTS = 16  # prompts per update (the mini batch); 8 responses each
LEARN_SAVE_EVERY = 20  # syncs between checkpoints


def cpu_learn(settings: Settings) -> dict[str, Any]:
    """verl's fully async GRPO that learns on CPU: the seed's recipe (geo3k-qwen3vl-8b-npu) in
    miniature. cpu-smoke's tiny Qwen2, warm-started on the answer format alone (its answers
    drawn at random, so its reward starts near chance), on sums of 0-2 that verl's gsm8k rule
    scores, 7 in 10 of them with the sum 2; GRPO with 8 responses a prompt and 16 prompts an
    update, the seed's async block (staleness 0.1, trigger_parameter_sync_step,
    require_batches, partial rollout) and its rollout correction as verl names it (decoupled
    sequence-level TIS with geometric rejection sampling: the IS weights applied to the loss).
    Responses of at most 6 tokens (the answer and its end: a policy that stops ending its
    answers drifts out of the format). 60 syncs, a checkpoint every 20. Assets:
    `rlrun verl make-smoke-assets --learn $RLRUN_VERL_DATA_DIR/rlrun-learn`."""
    body = cpu_smoke(settings)
    root = PurePosixPath(settings.verl_data_dir) / LEARN_DIR
    body["data"] = {**body["data"], **splits(root / "data"), "max_response_length": 6}
    body["model"] = {**body["model"], "path": str(root / "model")}
    body["actor"] = {
        **body["actor"],
        # At 1e-3, 2 runs of 2 left the format within 5 syncs (every reward 0 thereafter);
        # at 3e-4, 4 runs of 4 rose from 0.21-0.28 to 0.73.
        "optim": {"lr": 3e-4},
        "ppo_mini_batch_size": LEARN_PROMPTS,
        "ppo_micro_batch_size_per_gpu": 2 * LEARN_PROMPTS,
    }
    body["rollout"] = {
        **body["rollout"],
        "n": 8,
        "total_rollout_steps": LEARN_PROMPTS * LEARN_SYNCS,
        "log_prob_micro_batch_size_per_gpu": 2 * LEARN_PROMPTS,
    }
    body["algorithm"] = {
        "adv_estimator": "grpo",
        "rollout_correction": {
            "rollout_is": "sequence",
            "rollout_is_threshold": 2.0,
            "rollout_rs": "seq_mean_k1",
            "rollout_rs_threshold": "0.5_2.0",
            "bypass_mode": False,
        },
    }
    body["trainer"] = {
        **body["trainer"],
        "experiment_name": "cpu_learn",
        "save_freq": LEARN_SAVE_EVERY,
        "total_epochs": 20,
    }
    body["async_training"] = {
        "staleness_threshold": 0.1,
        "trigger_parameter_sync_step": 1,
        "require_batches": 1,
        "partial_rollout": True,
    }
    return body


SMOKE_V1_STEPS = 2  # V1 trainer steps, each a weight sync of parameter_sync_step updates


def cpu_smoke_v1(settings: Settings) -> dict[str, Any]:
    """``cpu-smoke`` on verl's V1 trainer (``trainer_mode: separate_async``): the same model,
    data, CPU shims and pools; 2 trainer steps of 2 updates each (parameter_sync_step 2 x
    ppo_mini_batch_size 2 = train_batch_size 4 prompts), one weight sync and one checkpoint a
    step. One storage unit of verl's transfer queue."""
    body = cpu_smoke(settings)
    del body["async_training"]
    del body["rollout"]["total_rollout_steps"]
    body["trainer_mode"] = "separate_async"
    body["actor"] = {**body["actor"], "ppo_mini_batch_size": 2}
    body["trainer"] = {
        **body["trainer"],
        "experiment_name": "cpu_smoke_v1",
        "total_training_steps": SMOKE_V1_STEPS,
    }
    body["v1"] = {"parameter_sync_step": 2, "max_off_policy_threshold": 2}
    body["overrides"] = [
        *body["overrides"],
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
    ]
    return body


SMOKE_VL_DIR = "rlrun-smoke-vl"  # under RLRUN_VERL_DATA_DIR: `rlrun verl make-smoke-assets --vl`
# A VL run on this stack, which has no torchvision (docs/guide/verl.md#cpu): images taken with
# PIL, not qwen_vl_utils (verl's dataset hook), and no video in vLLM's profile (no processor).
VL_OVERRIDES = [
    "data.custom_cls.name=ImageDataset",
    """+actor_rollout_ref.rollout.engine_kwargs.vllm.limit_mm_per_prompt='{"image":1,"video":0}'""",
]


def cpu_smoke_vl(settings: Settings) -> dict[str, Any]:
    """``cpu-smoke`` with the seed's model class: a random tiny Qwen3-VL (made by `rlrun verl
    make-smoke-assets --vl $RLRUN_VERL_DATA_DIR/rlrun-smoke-vl`) on geo3k-shaped image data
    (verl's geo3k format, scored by verl's geo3k reward), 3 syncs; with random weights every
    reward is 0. On the CPU stack it stops as vLLM's engine starts (vLLM 0.32 reads the
    processor's video processor, which needs torchvision: docs/guide/verl.md)."""
    body = cpu_smoke(settings)
    root = PurePosixPath(settings.verl_data_dir) / SMOKE_VL_DIR
    body["data"] = {
        **body["data"],
        **splits(root / "data"),
        "image_key": "images",
        "max_prompt_length": 64,
        "max_response_length": 24,
    }
    body["model"] = {**body["model"], "path": str(root / "model")}
    body["rollout"] = {**body["rollout"], "max_model_len": 128}
    body["trainer"] = {**body["trainer"], "experiment_name": "cpu_smoke_vl"}
    # The assets' one-line file that hands verl jobs.verl_cpu.vl_dataset's class.
    dataset = f"data.custom_cls.path={root / 'vl_dataset.py'}"
    body["overrides"] = [*body["overrides"], dataset, *VL_OVERRIDES]
    return body


PRESETS: dict[str, Preset] = {
    "geo3k-qwen3vl-8b-npu": geo3k_qwen3vl_8b_npu,
    "cpu-smoke": cpu_smoke,
    "cpu-smoke-v1": cpu_smoke_v1,
    "cpu-learn": cpu_learn,
    "cpu-smoke-vl": cpu_smoke_vl,
}


def deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``top``'s values in their place; mappings merge, everything else replaces."""
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out

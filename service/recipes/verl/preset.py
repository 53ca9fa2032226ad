"""Presets: named spec bodies that a request starts from; fields in the request replace theirs.

``geo3k-qwen3vl-8b-npu`` is verl's fully async GRPO example for Qwen3-VL-8B on geo3k on Ascend
NPU (``geo3k_qwen3vl_8b_fsdp2_16_16_npu.sh``), override for override. Deliberate differences:
data and model paths come from settings (not ``$HOME``), the checkpoint dir is per run and
absolute (the recipe sets it), ``trainer.device=npu`` (from ``resources``), and the logger list
keeps ``console`` and only those credentialed backends the deployment has configured.

``cpu-smoke`` runs verl's own trainer on CPU with a random tiny model (``cpu_smoke``).
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


PRESETS: dict[str, Preset] = {
    "geo3k-qwen3vl-8b-npu": geo3k_qwen3vl_8b_npu,
    "cpu-smoke": cpu_smoke,
    "cpu-smoke-v1": cpu_smoke_v1,
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

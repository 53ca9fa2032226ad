#!/usr/bin/env bash
# The real verl runs whose failures are in tests/data/failures (made by this project on CPU, the
# stack of the `verl-cpu` extra, assets from `python -m jobs.verl_cpu.assets $ASSETS`): verl's
# fully async trainer as a Ray job on a local head (LocalRayCluster([2], cpus_per_node=64)).
#   ADDRESS=http://127.0.0.1:<dashboard> TOKEN_PATH=<head's ray-token> ASSETS=... CKPT=...
#   SID=<submission id> STEPS=6 tests/verl_cpu_failures.sh [override...]
# TRAINER=v1: verl's V1 trainer (main_ppo, trainer_mode separate_async) with the cpu-smoke-v1
# preset's overrides instead. Each excerpt's header (each whole log's manifest entry,
# tests/verl_whole_logs.py) gives the overrides (or the kill) that made it fail.
set -euo pipefail
A=$ASSETS; CK=$CKPT; STEPS=${STEPS:-6}
export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=$TOKEN_PATH
if [ "${TRAINER:-}" = v1 ]; then
exec ray job submit --submission-id "$SID" --address "$ADDRESS" \
  --runtime-env-json '{"env_vars":{"VERL_PLATFORM":"cpu","VERL_ENGINE_DEVICE":"cuda","RLRUN_CPU_DEVICE_RESOURCE":"NPU","VLLM_CPU_KVCACHE_SPACE":"1","HYDRA_FULL_ERROR":"1","RAY_DEDUP_LOGS":"0","VERL_LOGGING_LEVEL":"WARN"}}' \
  -- python3 -m verl.trainer.main_ppo trainer.use_v1=True trainer.v1.trainer_mode=separate_async \
  trainer.v1.separate_async.parameter_sync_step=2 trainer.v1.sampler.max_off_policy_threshold=2 \
  data.train_files=$A/data/train.parquet data.val_files=$A/data/test.parquet \
  data.train_batch_size=4 data.max_prompt_length=64 data.max_response_length=16 \
  data.return_raw_chat=True data.shuffle=False \
  actor_rollout_ref.model.path=$A/model actor_rollout_ref.model.use_remove_padding=False \
  actor_rollout_ref.model.enable_gradient_checkpointing=False \
  +actor_rollout_ref.model.override_config.attn_implementation=sdpa \
  actor_rollout_ref.hybrid_engine=False actor_rollout_ref.actor.strategy=fsdp2 \
  actor_rollout_ref.actor.fsdp_config.dtype=float32 \
  actor_rollout_ref.actor.ppo_mini_batch_size=2 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
  actor_rollout_ref.actor.use_kl_loss=False actor_rollout_ref.actor.optim.lr=1e-5 \
  actor_rollout_ref.actor.use_torch_compile=False \
  actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.mode=async actor_rollout_ref.rollout.n=4 \
  actor_rollout_ref.rollout.dtype=float32 actor_rollout_ref.rollout.enforce_eager=True \
  actor_rollout_ref.rollout.free_cache_engine=False actor_rollout_ref.rollout.enable_prefix_caching=False \
  +actor_rollout_ref.rollout.engine_kwargs.vllm.compilation_config.cudagraph_mode=NONE \
  +actor_rollout_ref.rollout.enable_sleep_mode=False \
  actor_rollout_ref.rollout.tensor_model_parallel_size=1 actor_rollout_ref.rollout.max_model_len=128 \
  actor_rollout_ref.rollout.max_num_batched_tokens=1024 \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4 actor_rollout_ref.rollout.calculate_log_probs=True \
  actor_rollout_ref.rollout.checkpoint_engine.backend=file \
  actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=jobs.verl_cpu.weights \
  actor_rollout_ref.rollout.nnodes=1 actor_rollout_ref.rollout.n_gpus_per_node=1 \
  transfer_queue.backend.SimpleStorage.num_data_storage_units=1 algorithm.adv_estimator=grpo \
  trainer.device=cpu trainer.nnodes=1 trainer.n_gpus_per_node=1 'trainer.logger=[console]' \
  trainer.save_freq=1 trainer.test_freq=-1 trainer.val_before_train=False trainer.total_epochs=1 \
  trainer.total_training_steps=$STEPS trainer.default_local_dir=$CK trainer.resume_mode=auto \
  trainer.project_name=smoke trainer.experiment_name=v1 "$@"
fi
exec ray job submit --submission-id "$SID" --address "$ADDRESS" \
  --runtime-env-json '{"env_vars":{"VERL_PLATFORM":"cpu","VERL_ENGINE_DEVICE":"cuda","RLRUN_CPU_DEVICE_RESOURCE":"NPU","VLLM_CPU_KVCACHE_SPACE":"1","HYDRA_FULL_ERROR":"1","RAY_DEDUP_LOGS":"0"}}' \
  -- python3 -m verl.experimental.fully_async_policy.fully_async_main \
  --config-path=config --config-name=fully_async_ppo_trainer.yaml \
  data.train_files=$A/data/train.parquet data.val_files=$A/data/test.parquet \
  data.train_batch_size=0 data.gen_batch_size=1 data.max_prompt_length=64 data.max_response_length=16 \
  data.return_raw_chat=True data.shuffle=False \
  actor_rollout_ref.model.path=$A/model actor_rollout_ref.model.use_remove_padding=False \
  actor_rollout_ref.model.enable_gradient_checkpointing=False \
  +actor_rollout_ref.model.override_config.attn_implementation=sdpa \
  actor_rollout_ref.hybrid_engine=False actor_rollout_ref.actor.strategy=fsdp2 \
  actor_rollout_ref.actor.fsdp_config.dtype=float32 \
  actor_rollout_ref.actor.ppo_mini_batch_size=4 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
  actor_rollout_ref.actor.use_kl_loss=False actor_rollout_ref.actor.optim.lr=1e-5 \
  actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.mode=async actor_rollout_ref.rollout.n=4 \
  actor_rollout_ref.rollout.dtype=float32 actor_rollout_ref.rollout.enforce_eager=True \
  actor_rollout_ref.rollout.free_cache_engine=False actor_rollout_ref.rollout.enable_prefix_caching=False \
  +actor_rollout_ref.rollout.engine_kwargs.vllm.compilation_config.cudagraph_mode=NONE \
  +actor_rollout_ref.rollout.enable_sleep_mode=False \
  actor_rollout_ref.rollout.tensor_model_parallel_size=1 actor_rollout_ref.rollout.max_model_len=128 \
  actor_rollout_ref.rollout.max_num_batched_tokens=1024 \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4 actor_rollout_ref.rollout.calculate_log_probs=True \
  actor_rollout_ref.rollout.checkpoint_engine.backend=file \
  actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=jobs.verl_cpu.weights \
  rollout.total_rollout_steps=$STEPS rollout.nnodes=1 rollout.n_gpus_per_node=1 \
  algorithm.adv_estimator=grpo \
  trainer.device=cpu trainer.nnodes=1 trainer.n_gpus_per_node=1 'trainer.logger=[console]' \
  trainer.save_freq=1 trainer.test_freq=-1 trainer.val_before_train=False trainer.total_epochs=1 \
  trainer.default_local_dir=$CK trainer.resume_mode=auto \
  trainer.project_name=smoke trainer.experiment_name=byhand \
  async_training.trigger_parameter_sync_step=1 async_training.require_batches=1 \
  async_training.staleness_threshold=0.1 async_training.partial_rollout=True "$@"

"""The entry points verl and vLLM load (``pyproject.toml``): register, then shim on CPU runs."""

from __future__ import annotations

import functools
from typing import Any

from jobs.verl_cpu import enabled, vision

_applied = False


def load() -> None:
    """Register the ``cpu`` platform; on CPU runs, apply the shims (``verl_plugin`` calls it)."""
    from jobs.verl_cpu import cpu_platform  # noqa: F401 - registers the ``cpu`` platform

    if enabled():
        _dedupe_process_group_backend()
        _logger_flush_keyword()
        vision.without_torchvision()
        apply_vllm()


def load_vllm() -> None:
    """vLLM's ``vllm.general_plugins`` entry point, run in every vLLM engine process (which
    need not import verl before it loads the model)."""
    if enabled():
        vision.without_torchvision()
        apply_vllm()


def _dedupe_process_group_backend() -> None:
    """verl builds ``cpu:gloo,<device>:<backend>``, which on CPU names cpu twice
    (``Duplicate device type cpu in backend string``): keep each device's first backend."""
    import torch.distributed as dist

    original = dist.init_process_group
    if getattr(original, "_rlrun_dedupe", False):
        return

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        backend = kwargs.get("backend")
        if isinstance(backend, str) and "," in backend:
            seen: dict[str, str] = {}
            for part in backend.split(","):
                device = part.partition(":")[0]
                seen.setdefault(device, part)
            kwargs["backend"] = ",".join(seen.values())
        return original(*args, **kwargs)

    init_process_group._rlrun_dedupe = True  # type: ignore[attr-defined]
    dist.init_process_group = init_process_group


# verl 0.9.1's V1 trainer in separate_async mode with actor_rollout_ref.hybrid_engine=False logs
# its standalone rollout with ``logger.info(..., flush=True)`` (print's keyword), which logging
# refuses: the run fails at start with "Logger._log() got an unexpected keyword argument
# 'flush'" (trainer_separate_async.py, PPOTrainerSeparateAsync._setup), on any platform.
SEPARATE_ASYNC_LOGGER = "verl.trainer.ppo.v1.trainer_separate_async"


def _logger_flush_keyword(name: str = SEPARATE_ASYNC_LOGGER) -> None:
    """Let that module's logger take (and drop) ``flush``: logging.getLogger returns the same
    object for its name to verl's module, imported after this plugin."""
    import logging

    log = logging.getLogger(name)
    if getattr(log, "_rlrun_flush", False):
        return
    original = log._log

    def _log(level: int, msg: object, args: Any, **kwargs: Any) -> None:
        kwargs.pop("flush", None)
        original(level, msg, args, **kwargs)

    log._log = _log  # type: ignore[method-assign,assignment]
    log._rlrun_flush = True  # type: ignore[attr-defined]


def apply_vllm() -> None:
    global _applied
    if _applied:
        return
    _applied = True
    _plain_cpu_linear()
    _pause_generation_keyword()
    _digest_loaded_weights()


def _plain_cpu_linear() -> None:
    """vLLM's CPU linear layers pack their weights into a oneDNN (or SGL) handle and replace
    the parameter by an empty one, so verl cannot load new weights into them ("'Parameter'
    object has no attribute 'weight_loader'"). Keep the plain weight and multiply with it."""
    import torch
    from vllm.model_executor.layers import utils

    def dispatch_cpu_unquantized_gemm(layer: torch.nn.Module, remove_weight: bool) -> None:
        layer.cpu_linear = torch.nn.functional.linear

    utils.dispatch_cpu_unquantized_gemm = dispatch_cpu_unquantized_gemm


def _pause_generation_keyword() -> None:
    """verl 0.9.1 targets vLLM 0.24 and calls ``pause_generation(wait_for_inflight_requests=
    False)``; vLLM 0.32 takes ``mode="abort"|"wait"|"keep"`` instead."""
    from vllm.v1.engine.async_llm import AsyncLLM

    original = AsyncLLM.pause_generation
    if getattr(original, "_rlrun_compat", False):
        return

    @functools.wraps(original)
    async def pause_generation(self: Any, *args: Any, **kwargs: Any) -> Any:
        if "wait_for_inflight_requests" in kwargs:
            wait = kwargs.pop("wait_for_inflight_requests")
            kwargs.setdefault("mode", "wait" if wait else "abort")
        return await original(self, *args, **kwargs)

    pause_generation._rlrun_compat = True  # type: ignore[attr-defined]
    AsyncLLM.pause_generation = pause_generation


def _digest_loaded_weights() -> None:
    """Each vLLM worker says what its model loaded at a weight sync (``jobs.weight_digest``):
    the digest of every tensor verl's worker extension handed to the model, and a read-back of
    the parameters vLLM keeps under the trainer's names, taken right after each bucket loaded
    (the bucket's buffer is reused for the next)."""
    import torch
    from verl.workers.rollout.vllm_rollout import utils as vllm_utils

    from jobs import weight_digest

    extension = vllm_utils.vLLMColocateWorkerExtension
    if getattr(extension, "_rlrun_digest", False):
        return
    update_from_ipc, update = extension.update_weights_from_ipc, extension._update_weights

    @functools.wraps(update)
    def _update_weights(self: Any, weights: Any, *args: Any, **kwargs: Any) -> Any:
        result = update(self, weights, *args, **kwargs)
        sync = getattr(self, "_rlrun_sync", None)
        if sync is not None:
            digest, read_back = sync
            params = dict(self.model_runner.model.named_parameters())
            for name, tensor in weights:
                digest.add(name, tensor)
                param = params.get(name)
                if param is not None and tuple(param.shape) == tuple(tensor.shape):
                    read_back[1] += 1
                    read_back[0] += bool(torch.equal(param.data, tensor.to(param.dtype)))
        return result

    @functools.wraps(update_from_ipc)
    def update_weights_from_ipc(self: Any, *args: Any, **kwargs: Any) -> Any:
        self._rlrun_sync = (weight_digest.Digest(), [0, 0])
        try:
            result = update_from_ipc(self, *args, **kwargs)
            digest, read_back = self._rlrun_sync
            weight_digest.announce_rollout(digest, (read_back[0], read_back[1]))
            return result
        finally:
            self._rlrun_sync = None

    extension._update_weights = _update_weights
    extension.update_weights_from_ipc = update_weights_from_ipc
    extension._rlrun_digest = True

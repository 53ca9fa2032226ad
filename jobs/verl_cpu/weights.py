"""A checkpoint engine that moves weights trainer -> rollout through one file on the host.

Every built-in checkpoint engine of verl 0.9.1 needs CUDA, NCCL/HCCL or RDMA libraries, so a CPU
run syncs weights through a file (``checkpoint_engine.backend=file`` with
``custom_backend_module=jobs.verl_cpu.weights``): actor rank 0 saves the full state dict as it
walks verl's per-tensor generator (the other actor ranks walk it too: producing each tensor is
collective over the actor group) and renames it into place; each rollout worker waits for that
file and loads it. Trainer and rollout must therefore share a filesystem (one node, as here).
Actor rank 0 removes the file when the sync is finalized, and says the digest of what it sent
(``jobs.weight_digest``; each vLLM worker says the digest of what it loaded, ``plugin``).

``file-stale`` is a fault drill, not a transport to train with: it sends the first sync's
weights at every sync, so the rollout never sees the trainer's updates while every sync looks
done. Its sender still says the digest of the weights it should have sent: what a sync that
silently fails looks like to the service.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterable
from typing import Any

import torch
from verl.checkpoint_engine.base import CheckpointEngine, CheckpointEngineRegistry
from verl.workers.rollout.utils import ensure_async_iterator

from jobs import weight_digest

BACKEND = "file"
STALE_BACKEND = "file-stale"
DIR_ENV = "RLRUN_CPU_WEIGHTS_DIR"  # where the sync files go (default: the temp dir)
WAIT_S = 600.0
FILE = "weights.pt"


@CheckpointEngineRegistry.register(BACKEND)
class FileCheckpointEngine(CheckpointEngine):  # type: ignore[misc]
    def __init__(self, bucket_size: int = 0, is_master: bool = False, **_: Any) -> None:
        self.is_master = is_master
        self.path: str | None = None
        self.sender = False

    def prepare(self) -> dict[str, Any]:
        if not self.is_master:
            return {}
        base = os.environ.get(DIR_ENV) or tempfile.gettempdir()
        return {"path": os.path.join(base, f"rlrun-weights-{uuid.uuid4().hex}")}

    @classmethod
    def build_topology(
        cls, actor_wg_world_size: int, rollout_world_size: int, metadata: list[dict[str, Any]]
    ) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
        path = metadata[0]["path"]  # actor rank 0 comes first
        actor = {"path": [path] * actor_wg_world_size,
                 "sender": [r == 0 for r in range(actor_wg_world_size)]}  # fmt: skip
        rollout = {"path": [path] * rollout_world_size, "sender": [False] * rollout_world_size}
        return actor, rollout

    def init_process_group(self, path: str, sender: bool) -> None:
        self.path, self.sender = path, sender

    def finalize(self) -> None:
        if self.sender and self.path:
            shutil.rmtree(self.path, ignore_errors=True)
        self.path, self.sender = None, False

    async def send_weights(
        self, weights: Iterable[tuple[str, torch.Tensor]], global_steps: int | None = None
    ) -> None:
        state: dict[str, torch.Tensor] = {}
        async for name, tensor in ensure_async_iterator(weights):
            if self.sender:
                state[name] = tensor.detach().to("cpu", copy=True)
        if not self.sender or self.path is None:
            return
        digest = weight_digest.Digest()
        digest.add_all(state.items())
        os.makedirs(self.path, exist_ok=True)
        partial = os.path.join(self.path, FILE + ".partial")
        torch.save(self.to_send(state), partial)
        os.replace(partial, os.path.join(self.path, FILE))  # readers never see half a file
        weight_digest.announce_trainer(global_steps, digest)

    def to_send(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """What goes into the sync's file: the state itself."""
        return state

    async def receive_weights(
        self, global_steps: int | None = None
    ) -> AsyncIterator[tuple[str, torch.Tensor]]:
        assert self.path is not None, "init_process_group was not called"
        target = os.path.join(self.path, FILE)
        deadline = time.monotonic() + WAIT_S
        while not os.path.exists(target):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no weights at {target} after {WAIT_S:g}s")
            await asyncio.sleep(0.05)
        state = torch.load(target, map_location="cpu", weights_only=True)
        for name, tensor in state.items():
            yield name, tensor


@CheckpointEngineRegistry.register(STALE_BACKEND)
class StaleFileCheckpointEngine(FileCheckpointEngine):
    """The fault drill ``file-stale``: every sync sends the first sync's weights."""

    _first: dict[str, torch.Tensor] | None = None

    def to_send(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if StaleFileCheckpointEngine._first is None:
            StaleFileCheckpointEngine._first = state
        return StaleFileCheckpointEngine._first

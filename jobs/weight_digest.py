"""Proof that a weight sync reached the rollout: a digest of the weights on each side, one line
in the job's log per side and sync, ``rlrun weights: {...}``.

- The trainer's side (the checkpoint engine's sender, actor rank 0) digests the state it sends
  for parameter version N: ``{"side": "trainer", "version": N, "digest": ..., "tensors": T}``.
- The rollout's side (each vLLM worker, after the model loaded the sync's weights) digests what
  the model was given and reads back every parameter whose name and shape are the trainer's
  (vLLM fuses q/k/v and gate/up, the rest it keeps as named):
  ``{"side": "rollout", "digest": ..., "tensors": T, "read_back": [equal, checked]}``.

The digest is the same on both sides for the same weights whatever order they came in: SHA-256
over the sorted (name, dtype, shape, SHA-256 of the bytes) of every tensor. The service pairs
the sides by digest (``service.metrics.weight_sync``): a version whose trainer digest no rollout
reports by the next sync, or a rollout digest that no trainer sent, is a sync that did not land.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any, Protocol

PREFIX = "rlrun weights: "


class Tensor(Protocol):
    dtype: Any
    shape: Any

    def detach(self) -> Any: ...


class Digest:
    """A running digest over named tensors, in any order."""

    def __init__(self) -> None:
        self._parts: dict[str, str] = {}

    def add(self, name: str, tensor: Tensor) -> None:
        import torch

        flat = tensor.detach().to("cpu").contiguous().reshape(-1)
        data = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
        shape = "x".join(str(int(d)) for d in tensor.shape)
        self._parts[name] = f"{name}|{str(tensor.dtype).removeprefix('torch.')}|{shape}|" + (
            hashlib.sha256(data).hexdigest()
        )

    def add_all(self, pairs: Iterable[tuple[str, Tensor]]) -> None:
        for name, tensor in pairs:
            self.add(name, tensor)

    @property
    def tensors(self) -> int:
        return len(self._parts)

    def hexdigest(self) -> str:
        joined = "\n".join(self._parts[name] for name in sorted(self._parts))
        return hashlib.sha256(joined.encode()).hexdigest()


def line(record: dict[str, Any]) -> str:
    return PREFIX + json.dumps(record, sort_keys=True)


def announce_trainer(version: int | None, digest: Digest) -> None:
    record = {"side": "trainer", "version": version, "digest": digest.hexdigest()}
    print(line(record | {"tensors": digest.tensors}), flush=True)


def announce_rollout(digest: Digest, read_back: tuple[int, int]) -> None:
    record = {"side": "rollout", "digest": digest.hexdigest(), "tensors": digest.tensors}
    print(line(record | {"read_back": list(read_back)}), flush=True)

"""Checkpoints as verl lays them out: ``<dir>/global_step_<N>/`` per saved parameter version and
the tracker file ``latest_checkpointed_iteration.txt``. A checkpoint is written to a temporary
directory and renamed into place, so a ``global_step_*`` directory is always complete; resume
takes the newest one even when the tracker is missing or behind (verl's own resume starts from
step 0 when the tracker was never written)."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np

from jobs.tiny_grpo.policy import Weights

TRACKER = "latest_checkpointed_iteration.txt"
_STEP_DIR = re.compile(r"global_step_(\d+)")


def save(root: Path, version: int, weights: Weights, global_step: int, cursor: int) -> Path:
    """Write the checkpoint of parameter ``version``; its directory."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"global_step_{version}"
    staging = Path(tempfile.mkdtemp(prefix=".saving-", dir=root))
    np.savez(
        staging / "state.npz",
        fmt=weights.fmt,
        answer=weights.answer,
        version=version,
        global_step=global_step,
        cursor=cursor,
    )
    if final.exists():
        shutil.rmtree(final)
    os.replace(staging, final)
    tracker = root / f".{TRACKER}.tmp"
    tracker.write_text(str(version))
    os.replace(tracker, root / TRACKER)
    return final


def newest(root: Path) -> Path | None:
    """The newest complete checkpoint under ``root``, by its step (not the tracker)."""
    if not root.is_dir():
        return None
    steps = [
        (int(m.group(1)), path)
        for path in root.iterdir()
        if (m := _STEP_DIR.fullmatch(path.name)) and (path / "state.npz").is_file()
    ]
    return max(steps)[1] if steps else None


def load(path: Path) -> tuple[Weights, int, int, int]:
    """(weights, parameter version, trainer global step, rollout cursor) of a checkpoint."""
    with np.load(path / "state.npz") as state:
        weights = Weights(state["fmt"].copy(), state["answer"].copy())
        return weights, int(state["version"]), int(state["global_step"]), int(state["cursor"])

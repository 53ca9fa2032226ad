"""Whether an attempt that resumes from a checkpoint did resume from it, checked after the
fact from what verl says as it starts and from its first step lines.

The launcher says where an attempt resumes (``rlrun resume: {"step": N}``, the run's
``resumed_from_step``) and hands verl the overrides for it; verl may still start elsewhere: from
step 0 when its tracker file is missing or ``resume_mode`` says so (verl #7952), from another
``global_step_*`` than the one decided, or with its data position from scratch while its weights
resumed. What verl 0.9.1's fully async trainer prints tells which:

- ``[FullyAsyncTrainer] Load from checkpoint folder: .../global_step_K`` and
  ``Setting global step to G, current_param_version to V``: the weights' step (V is K);
- ``[FullyAsyncRollouter] Loaded dataloader state from .../global_step_K/data.pt``: the data
  position; ``Warning: No dataloader state found`` or ``Training from scratch (no checkpoint
  found)``: the data from the start;
- ``[FullyAsyncTrainer] _fit_update_weights, ... self.current_param_version: V`` at each weight
  sync, and each step line's ``fully_async/count/current_param_version``: never below the
  checkpoint's step once resumed (the first sync says it).

A trainer told to start over (``resume_mode=disable``) says nothing of a checkpoint: its first
step line, at version 0, shows it. Any of these off from the checkpoint is a mismatch: an event
and the run's health ``resume_mismatch``, with both numbers.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from sqlalchemy.orm import Session

from service.metrics.keys import STEP_KEY
from service.metrics.parse import MetricLine
from service.store.lifecycle import set_health
from service.store.models import Run
from service.store.status import METRIC_HEALTH, RESUME_HEALTH

_WEIGHTS = re.compile(r"\[FullyAsyncTrainer\] Load from checkpoint folder: \S*?global_step_(\d+)")
_VERSION = re.compile(
    r"\[FullyAsyncTrainer\] Setting global step to \d+, current_param_version to (\d+)"
)
_DATA = re.compile(r"\[FullyAsyncRollouter\] Loaded dataloader state from \S*?global_step_(\d+)")
# Each weight sync, as the trainer says it: the version the rollout then has.
_SYNCED = re.compile(
    r"\[FullyAsyncTrainer\] _fit_update_weights, .*?self\.current_param_version: (\d+)"
)
_DATA_FROM_START = re.compile(
    r"\[FullyAsyncRollouter\] (Warning: No dataloader state found|Training from scratch)"
)
# A cheap test of a read's text before any pattern runs.
_ANY = ("[FullyAsyncTrainer] ", "[FullyAsyncRollouter] ")


def _off(what: str, got: int, expected: int) -> str:
    how = "restarted from 0" if got == 0 else f"an offset of {got - expected:+d}"
    return f"resumed from checkpoint step {expected}, but {what} {got} ({how})"


def mismatch(expected: int, text: str, lines: Sequence[MetricLine]) -> str | None:
    """Why an attempt that resumes from checkpoint step ``expected`` did not, from a read of
    its log (``text``) and the metric lines parsed from it; None when nothing read says so."""
    if expected <= 0:
        return None
    if any(s in text for s in _ANY):
        for match in _WEIGHTS.finditer(text):
            if (got := int(match.group(1))) != expected:
                return _off("verl's trainer loaded the checkpoint of step", got, expected)
        for match in _VERSION.finditer(text):
            if (got := int(match.group(1))) != expected:
                return _off("verl's trainer set its parameter version to", got, expected)
        for match in _DATA.finditer(text):
            if (got := int(match.group(1))) != expected:
                return _off("verl's rollouter loaded its data position of step", got, expected)
        for match in _SYNCED.finditer(text):
            if (got := int(match.group(1))) < expected:
                return _off("verl's trainer synced the rollout's weights at version", got, expected)
        if _DATA_FROM_START.search(text):
            return (
                f"resumed from checkpoint step {expected}, but verl's rollouter read its data "
                "from the start (no data position of that step; restarted from 0)"
            )
    for line in lines:
        version = line.values.get(STEP_KEY)
        if version is not None and version == version and version < expected:
            return _off("its first synced parameter version is", int(version), expected)
    return None


def check(session: Session, run: Run, text: str, lines: Sequence[MetricLine]) -> None:
    """Flag ``run``'s attempt when this read shows it did not resume where it was to (its
    health, with an event; once: a flag raised holds for the attempt)."""
    expected = run.resumed_from_step
    if not expected or run.health in RESUME_HEALTH or run.health not in METRIC_HEALTH:
        return
    reason = mismatch(expected, text, lines)
    if reason is not None:
        set_health(session, run, "resume_mismatch", reason)

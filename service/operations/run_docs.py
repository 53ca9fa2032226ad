"""A run's documents (``wire.runs.RunSummary``, ``wire.runs.RunOut``), built from its row,
events and latest metrics: what they show of the run's attempts, priority and spec (secrets
masked) is decided by the domain modules they read, which is why they are built here and not
in ``wire``.

The fields their models mark ``STORED`` are copied from the row by name (the read selects them,
``store.runs``), the others made here; ``tests/test_answer_contracts.py`` holds every key made
here to a field of its model and every field to a key made."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import Any

from service.metrics import startup, weight_sync
from service.metrics.keys import REWARD_KEY, STEP_KEY, TRAINER_STEP_KEY, progress_key
from service.recovery.attempts import history, job_id
from service.scheduling.priority import PRIORITY_NAMES
from service.team_secrets import masked_runtime_env, masked_spec
from service.wire.documents import stored_fields
from service.wire.runs import RunOut, RunSummary, event_doc

# What a run's summary shows of its metrics: progress and the latest mean reward.
SUMMARY_KEYS = (STEP_KEY, TRAINER_STEP_KEY, REWARD_KEY)

Latest = dict[str, tuple[int, float]]


def _copier(names: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    """The values of ``names`` of a row, in one call (``attrgetter`` of one name gives no tuple)."""
    get = attrgetter(*names)
    return get if len(names) > 1 else lambda row: (get(row),)


_SUMMARY_STORED = stored_fields(RunSummary)
_RUN_STORED = tuple(n for n in stored_fields(RunOut) if n not in _SUMMARY_STORED)
_summary_values, _run_values = _copier(_SUMMARY_STORED), _copier(_RUN_STORED)


def summary_doc(
    run: Any, latest: Latest | None = None, baseline: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A ``RunSummary``; ``baseline`` its difference from its baseline (``operations.baseline``)."""
    latest = latest or {}
    reward = latest.get(REWARD_KEY)
    total = run.total_steps if hasattr(run, "total_steps") else run.launch.get("total_steps")
    key = (
        progress_key({"progress_key": run.progress_key})
        if hasattr(run, "progress_key")
        else progress_key(run.launch)
    )
    return dict(
        zip(_SUMMARY_STORED, _summary_values(run), strict=True),
        priority=PRIORITY_NAMES.get(run.priority, str(run.priority)),
        health={"status": run.health, "reason": run.health_reason},
        queue_reason=run.queue_reason if run.status == "QUEUED" else None,
        progress=progress_doc(total, latest, key),
        reward=reward[1] if reward else None,
        links={"self": f"/runs/{run.id}", "cancel": f"/runs/{run.id}/cancel"},
        baseline=baseline,
    )


def run_doc(
    run: Any,
    events: Sequence[Any],
    latest: Latest | None = None,
    ended: Sequence[Any] = (),
    baseline: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A ``RunOut``; ``events`` are rows or RunEvents, ``ended`` its ended attempts. Secrets
    and key-like values masked."""
    launch = run.launch
    latest = latest or {}
    return summary_doc(run, latest, baseline) | dict(
        zip(_RUN_STORED, _run_values(run), strict=True),
        spec=masked_spec(run.spec),
        command=launch["argv"],
        entrypoint=launch["entrypoint"],
        runtime_env=masked_runtime_env(launch["runtime_env"]),
        shape=launch["shape"],
        warnings=launch.get("warnings", []),
        ray={
            "submission_id": job_id(run.id, run.attempt or 1),
            "status": run.ray_status,
            "message": run.ray_message,
            "error_type": run.ray_error_type,
            "exit_code": run.ray_exit_code,
        },
        stop_requested=run.stop_requested_at is not None,
        attempt=run.attempt or 1,
        attempts=history(run, ended),
        budget_wait=run.budget_wait if run.status == "QUEUED" else None,
        checkpoint=(
            {"step": run.checkpoint_step, "at": run.checkpoint_at}
            if run.checkpoint_step is not None
            else None
        ),
        stop=stop_doc(run),
        metrics={
            "step": max((s for s, _ in latest.values()), default=None),
            "latest": {k: v for k, (_, v) in sorted(latest.items())},
        },
        events=[event_doc(e) for e in events],
        startup=startup.phases(run.created_at, events, run.startup, run.preflight, run.queued_why),
        time_to_first_step=startup.first_step_seconds(run.created_at, run.startup),
        weight_sync=weight_sync.summary(run.weight_syncs, run.attempt),
    )


def stop_doc(run: Any) -> dict[str, Any] | None:
    """A ``StopOut``: the run's stop at its next checkpoint, if one was asked for."""
    if run.yield_then is None:
        return None
    return {
        "at": "next_checkpoint",
        "by": run.yield_by,
        "reason": run.yield_reason,
        "then": run.yield_then,
        "saved_step": run.stop_saved_step,
        "steps_lost": run.stop_lost_steps,
    }


def progress_doc(
    total_steps: int | None, latest: Latest, key: str = STEP_KEY
) -> dict[str, int | str | None]:
    """``step`` is the parameter version (weight syncs, read from ``key``) of ``total_steps``
    planned syncs."""

    def count(key: str) -> int | None:
        value = latest.get(key, (0, math.nan))[1]
        return int(value) if math.isfinite(value) else None

    return {
        "step": count(key),
        "total_steps": total_steps,
        "trainer_step": count(TRAINER_STEP_KEY),
        "key": key,
    }

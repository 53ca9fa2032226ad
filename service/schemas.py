"""Run responses built from the database rows (the models themselves are in ``service.wire``)."""

from __future__ import annotations

import math
from typing import Any

from service.recipes.base import PRIORITY_NAMES
from service.store.models import Run, RunEvent
from service.wire import EventOut, HealthOut, MetricsOut, ProgressOut, RayOut, RunOut, RunSummary


def json_value(value: float) -> float | str:
    """JSON has no NaN/inf: they travel as the strings "NaN", "Infinity", "-Infinity"."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return value


# What a run's summary shows of its metrics: progress and the latest mean reward.
SUMMARY_KEYS = (
    "fully_async/count/current_param_version",
    "training/global_step",
    "critic/score/mean",
)


def summary_fields(run: Run, latest: dict[str, tuple[int, float]] | None = None) -> dict[str, Any]:
    latest = latest or {}
    reward = latest.get("critic/score/mean")
    return {
        "id": run.id,
        "name": run.name,
        "recipe": run.recipe,
        "team": run.team,
        "priority": PRIORITY_NAMES.get(run.priority, str(run.priority)),
        "status": run.status,
        "health": HealthOut(status=run.health, reason=run.health_reason),
        "queue_reason": run.queue_reason if run.status == "QUEUED" else None,
        "progress": progress_of(run.launch, latest),
        "reward": json_value(reward[1]) if reward else None,
        "created_at": run.created_at,
        "submitted_at": run.submitted_at,
        "started_at": run.started_at,
        "ended_at": run.ended_at,
        "links": {
            "self": f"/runs/{run.id}",
            "cancel": f"/runs/{run.id}/cancel",
        },
    }


def run_summary(run: Run, latest: dict[str, tuple[int, float]] | None = None) -> RunSummary:
    return RunSummary(**summary_fields(run, latest))


def run_out(
    run: Run, events: list[RunEvent], latest: dict[str, tuple[int, float]] | None = None
) -> RunOut:
    launch = run.launch
    latest = latest or {}
    return RunOut(
        **summary_fields(run, latest),
        spec=run.spec,
        command=launch["argv"],
        entrypoint=launch["entrypoint"],
        runtime_env=launch["runtime_env"],
        shape=launch["shape"],
        warnings=launch.get("warnings", []),
        ray=RayOut(
            submission_id=run.id,
            status=run.ray_status,
            message=run.ray_message,
            error_type=run.ray_error_type,
            exit_code=run.ray_exit_code,
        ),
        stop_requested=run.stop_requested_at is not None,
        preflight=run.preflight,
        metrics=MetricsOut(
            step=max((s for s, _ in latest.values()), default=None),
            latest={k: json_value(v) for k, (_, v) in sorted(latest.items())},
        ),
        events=[
            EventOut(
                id=e.id, at=e.at, from_status=e.from_status, to_status=e.to_status, reason=e.reason
            )
            for e in events
        ],
    )


def progress_of(launch: dict[str, Any], latest: dict[str, tuple[int, float]]) -> ProgressOut:
    def count(key: str) -> int | None:
        value = latest.get(key, (0, math.nan))[1]
        return int(value) if math.isfinite(value) else None

    return ProgressOut(
        step=count("fully_async/count/current_param_version"),
        total_steps=launch.get("total_steps"),
        trainer_step=count("training/global_step"),
    )

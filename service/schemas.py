"""Response models of the API (requests are recipe spec models, see ``service.recipes``)."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from pydantic import BaseModel

from service.recipes.base import PRIORITY_NAMES
from service.store.models import Run, RunEvent


def json_value(value: float) -> float | str:
    """JSON has no NaN/inf: they travel as the strings "NaN", "Infinity", "-Infinity"."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return value


class EventOut(BaseModel):
    id: int
    at: datetime
    from_status: str | None
    to_status: str
    reason: str


class RayOut(BaseModel):
    submission_id: str
    status: str | None
    message: str | None
    error_type: str | None
    exit_code: int | None


class ProgressOut(BaseModel):
    """``step`` is the parameter version (weight syncs) of ``total_steps`` planned syncs."""

    step: int | None = None
    total_steps: int | None = None
    trainer_step: int | None = None


class MetricsOut(BaseModel):
    """Key -> value at the newest step it was logged (NaN/inf as "NaN"/"Infinity" strings)."""

    step: int | None = None
    latest: dict[str, float | str] = {}


class HealthOut(BaseModel):
    status: str
    reason: str | None


class RunSummary(BaseModel):
    id: str
    name: str
    recipe: str
    team: str
    priority: str
    status: str
    health: HealthOut
    queue_reason: str | None = None
    created_at: datetime
    submitted_at: datetime | None
    started_at: datetime | None
    ended_at: datetime | None
    links: dict[str, str]


class RunOut(RunSummary):
    spec: dict[str, Any]
    command: list[str]
    entrypoint: str
    runtime_env: dict[str, Any]
    shape: dict[str, Any]
    warnings: list[str]
    ray: RayOut
    stop_requested: bool
    progress: ProgressOut
    metrics: MetricsOut
    events: list[EventOut]


class RunPage(BaseModel):
    items: list[RunSummary]
    next_cursor: str | None


def summary_fields(run: Run) -> dict[str, Any]:
    return {
        "id": run.id,
        "name": run.name,
        "recipe": run.recipe,
        "team": run.team,
        "priority": PRIORITY_NAMES.get(run.priority, str(run.priority)),
        "status": run.status,
        "health": HealthOut(status=run.health, reason=run.health_reason),
        "queue_reason": run.queue_reason if run.status == "QUEUED" else None,
        "created_at": run.created_at,
        "submitted_at": run.submitted_at,
        "started_at": run.started_at,
        "ended_at": run.ended_at,
        "links": {
            "self": f"/runs/{run.id}",
            "cancel": f"/runs/{run.id}/cancel",
        },
    }


def run_summary(run: Run) -> RunSummary:
    return RunSummary(**summary_fields(run))


def run_out(
    run: Run, events: list[RunEvent], latest: dict[str, tuple[int, float]] | None = None
) -> RunOut:
    launch = run.launch
    latest = latest or {}
    return RunOut(
        **summary_fields(run),
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
        progress=progress_of(launch, latest),
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

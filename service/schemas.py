"""Run answers built from database rows as plain documents, serialised once.

The models that document these answers (and that the client reads them into) are in
``service.wire``; routes send the documents as they are (``json_response``), without validating
them again. A document is built from a ``Run`` or from a row with the same columns.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from fastapi import Response
from pydantic_core import to_json

from service.metrics.keys import REWARD_KEY, STEP_KEY, TRAINER_STEP_KEY
from service.scheduling.priority import PRIORITY_NAMES
from service.team_secrets import masked_runtime_env, masked_spec

# What a run's summary shows of its metrics: progress and the latest mean reward.
SUMMARY_KEYS = (STEP_KEY, TRAINER_STEP_KEY, REWARD_KEY)

Latest = dict[str, tuple[int, float]]


def summary_doc(run: Any, latest: Latest | None = None) -> dict[str, Any]:
    """A ``RunSummary``."""
    latest = latest or {}
    reward = latest.get(REWARD_KEY)
    total = run.total_steps if hasattr(run, "total_steps") else run.launch.get("total_steps")
    return {
        "id": run.id,
        "name": run.name,
        "recipe": run.recipe,
        "team": run.team,
        "priority": PRIORITY_NAMES.get(run.priority, str(run.priority)),
        "status": run.status,
        "health": {"status": run.health, "reason": run.health_reason},
        "queue_reason": run.queue_reason if run.status == "QUEUED" else None,
        "progress": progress_doc(total, latest),
        "reward": reward[1] if reward else None,
        "created_at": run.created_at,
        "submitted_at": run.submitted_at,
        "started_at": run.started_at,
        "ended_at": run.ended_at,
        "links": {
            "self": f"/runs/{run.id}",
            "cancel": f"/runs/{run.id}/cancel",
        },
    }


def run_doc(run: Any, events: Sequence[Any], latest: Latest | None = None) -> dict[str, Any]:
    """A ``RunOut``; ``events`` are rows or RunEvents. Secrets and key-like values masked."""
    launch = run.launch
    latest = latest or {}
    return summary_doc(run, latest) | {
        "spec": masked_spec(run.spec),
        "command": launch["argv"],
        "entrypoint": launch["entrypoint"],
        "runtime_env": masked_runtime_env(launch["runtime_env"]),
        "shape": launch["shape"],
        "warnings": launch.get("warnings", []),
        "ray": {
            "submission_id": run.id,
            "status": run.ray_status,
            "message": run.ray_message,
            "error_type": run.ray_error_type,
            "exit_code": run.ray_exit_code,
        },
        "stop_requested": run.stop_requested_at is not None,
        "preflight": run.preflight,
        "failure": run.failure,
        "metrics": {
            "step": max((s for s, _ in latest.values()), default=None),
            "latest": {k: v for k, (_, v) in sorted(latest.items())},
        },
        "events": [event_doc(e) for e in events],
    }


def encode(doc: Any) -> bytes:
    """The one JSON encoding of every answer and streamed event (pydantic-core's serializer):
    datetimes in ISO 8601 with ``Z``; JSON has no NaN/inf, so they travel as the strings
    "NaN", "Infinity", "-Infinity"."""
    return to_json(doc, inf_nan_mode="strings")


def event_doc(event: Any) -> dict[str, Any]:
    """A status event (a ``RunEvent`` or a row with its columns), in a run and on its stream."""
    return {
        "id": event.id,
        "at": event.at,
        "from_status": event.from_status,
        "to_status": event.to_status,
        "reason": event.reason,
    }


def progress_doc(total_steps: int | None, latest: Latest) -> dict[str, int | None]:
    """``step`` is the parameter version (weight syncs) of ``total_steps`` planned syncs."""

    def count(key: str) -> int | None:
        value = latest.get(key, (0, math.nan))[1]
        return int(value) if math.isfinite(value) else None

    return {
        "step": count(STEP_KEY),
        "total_steps": total_steps,
        "trainer_step": count(TRAINER_STEP_KEY),
    }


def json_response(
    doc: Any, status_code: int = 200, headers: dict[str, str] | None = None
) -> Response:
    """``doc`` serialised once, by ``encode``."""
    return Response(encode(doc), status_code, headers, media_type="application/json")

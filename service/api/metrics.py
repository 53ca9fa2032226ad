"""A run's metrics and log: downsampled history, the live event stream, the kept log copy."""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Header, Query
from fastapi.responses import PlainTextResponse, Response
from fastapi.sse import EventSourceResponse, ServerSentEvent
from pydantic import BaseModel

from service.api.runs import load_run
from service.deps import ServicesDep, SessionDep
from service.errors import InvalidSpec, field_error
from service.metrics import logcopy, store
from service.metrics.broker import Cursor
from service.metrics.store import json_value

router = APIRouter(prefix="/runs", tags=["metrics"])


class PointOut(BaseModel):
    step: int
    value: float | str
    min: float | str
    max: float | str


class SeriesOut(BaseModel):
    run_id: str
    series: dict[str, list[PointOut]]


def existing_run(session: SessionDep, run_id: str) -> str:
    load_run(session, run_id)
    return run_id


RunIdDep = Annotated[str, Depends(existing_run)]


@router.get("/{run_id}/metrics", response_model=SeriesOut)
def metric_series(
    session: SessionDep,
    run_id: RunIdDep,
    keys: Annotated[str | None, Query(description="comma-separated keys; all when absent")] = None,
    max_points: Annotated[int, Query(ge=2, le=100_000)] = 1000,
    from_step: Annotated[int | None, Query(ge=0)] = None,
    to_step: Annotated[int | None, Query(ge=0)] = None,
) -> Response:
    """History per key, all keys in one read. Above ``max_points`` steps, each point is an
    aligned bucket of a power-of-two number of steps: its last step and value with its min and
    max. NaN and infinities are the strings "NaN", "Infinity", "-Infinity"."""
    if from_step is not None and to_step is not None and to_step < from_step:
        msg = "to_step must not be below from_step"
        raise InvalidSpec(msg, [field_error(["query", "to_step"], msg)])
    names = list(dict.fromkeys(k for k in (keys or "").split(",") if k)) or None
    found = store.series(session, run_id, names, max_points, from_step, to_step)
    # Built as plain JSON: a dashboard page of keys is tens of thousands of points.
    body = {
        "run_id": run_id,
        "series": {
            key: [
                {"step": p.step, "value": _j(p.value), "min": _j(p.min), "max": _j(p.max)}
                for p in points
            ]
            for key, points in found.items()
        },
    }
    return Response(json.dumps(body, separators=(",", ":")), media_type="application/json")


def _j(value: float) -> float | str:
    return value if -math.inf < value < math.inf else json_value(value)


@router.get("/{run_id}/logs", response_class=PlainTextResponse)
def run_logs(
    session: SessionDep,
    run_id: RunIdDep,
    tail: Annotated[int | None, Query(ge=0, description="only the last N lines")] = None,
) -> str:
    """The service's own copy of the job log (the newest part, up to its configured size)."""
    return logcopy.tail(session, run_id, tail)


def _existing_run_stream(services: ServicesDep, run_id: str) -> str:
    # Checked in its own short transaction: the stream must not hold one open.
    with services.db.transaction() as session:
        load_run(session, run_id)
    return run_id


def _stream_start(
    services: ServicesDep,
    run_id: Annotated[str, Depends(_existing_run_stream)],
    last_event_id: Annotated[str | None, Header()] = None,
    since: Annotated[
        Literal["start", "now"],
        Query(description="without Last-Event-ID: replay from the start, or only what comes next"),
    ] = "start",
) -> Cursor:
    # Taken before the response starts: once a client sees the stream open, "now" is fixed.
    if last_event_id is None and since == "now":
        return services.broker.head_of(run_id)
    return Cursor.parse(last_event_id)


@router.get("/{run_id}/events", response_class=EventSourceResponse)
async def run_events(
    services: ServicesDep,
    run_id: Annotated[str, Depends(_existing_run_stream)],
    start: Annotated[Cursor, Depends(_stream_start)],
) -> AsyncIterator[ServerSentEvent]:
    """``status`` and ``metrics`` events (a metrics event carries its step and all its values):
    everything after ``Last-Event-ID`` (or from the start, or from now), then live ones; a last
    ``end`` event once the run has ended and its log is read to the end. Event ids are
    ``<status event id>-<log offset>`` (resume is exact for both)."""
    async for item, cursor in services.broker.subscribe(run_id, start):
        yield ServerSentEvent(event=item.kind, data=item.data, id=cursor.encode())

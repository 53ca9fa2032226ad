"""A run's metrics and log: downsampled history, the live event stream, the kept log copy."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Query
from fastapi.responses import PlainTextResponse
from fastapi.sse import EventSourceResponse, ServerSentEvent

from service.api.deps import ServicesDep, SessionDep
from service.errors import InvalidSpec, field_error
from service.metrics import logcopy, store
from service.metrics.broker import Cursor
from service.schemas import json_value
from service.store.runs import load_run
from service.wire import PointOut, SeriesOut

router = APIRouter(prefix="/runs", tags=["metrics"])


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
) -> SeriesOut:
    """History per key; above ``max_points`` each point is a bucket's last value with its
    min and max. NaN and infinities are the strings "NaN", "Infinity", "-Infinity"."""
    if from_step is not None and to_step is not None and to_step < from_step:
        msg = "to_step must not be below from_step"
        raise InvalidSpec(msg, [field_error(["query", "to_step"], msg)])
    names = [k for k in (keys or "").split(",") if k] or sorted(store.keys_of(session, run_id))
    return SeriesOut(
        run_id=run_id,
        series={
            key: [
                PointOut(
                    step=p.step,
                    value=json_value(p.value),
                    min=json_value(p.min),
                    max=json_value(p.max),
                )
                for p in store.series(session, run_id, key, max_points, from_step, to_step)
            ]
            for key in names
        },
    )


@router.get("/{run_id}/metrics/keys")
def metric_keys(session: SessionDep, run_id: RunIdDep) -> list[str]:
    """Every key the run has logged, sorted."""
    return sorted(store.keys_of(session, run_id))


@router.get(
    "/{run_id}/logs",
    response_class=PlainTextResponse,
    responses={200: {"headers": {"Log-Offset": {}, "Log-Complete": {}}}},
)
def run_logs(
    session: SessionDep,
    run_id: RunIdDep,
    tail: Annotated[int | None, Query(ge=0, description="only the last N lines")] = None,
    offset: Annotated[
        int | None, Query(ge=0, description="only what follows this offset (a Log-Offset)")
    ] = None,
    ansi: Annotated[bool, Query(description="keep terminal colour codes")] = False,
) -> PlainTextResponse:
    """The service's own copy of the job log (the newest part, up to its configured size),
    without terminal escape codes unless ``ansi=true``. ``Log-Offset`` is where this answer
    ends (pass it as ``offset`` to read on); ``Log-Complete: true`` once nothing more will come."""
    if offset is not None:
        text, end = logcopy.since(session, run_id, offset)
    else:
        text, end = logcopy.tail(session, run_id, tail), logcopy.end(session, run_id)
    headers = {
        "Log-Offset": str(end),
        "Log-Complete": str(logcopy.finished(session, run_id)).lower(),
    }
    return PlainTextResponse(text if ansi else logcopy.strip_ansi(text), headers=headers)


def _existing_run_stream(services: ServicesDep, run_id: str) -> str:
    # Checked in its own short transaction: the stream must not hold one open.
    with services.db.transaction() as session:
        load_run(session, run_id)
    return run_id


@router.get("/{run_id}/events", response_class=EventSourceResponse)
async def run_events(
    services: ServicesDep,
    run_id: Annotated[str, Depends(_existing_run_stream)],
    last_event_id: Annotated[str | None, Header()] = None,
) -> AsyncIterator[ServerSentEvent]:
    """``status`` and ``metrics`` events: everything after ``Last-Event-ID`` (or from the
    start), then live ones; a last ``end`` event once the run has ended and its log is read
    to the end. Event ids are ``<status event id>-<log offset>`` (resume is exact for both)."""
    async for item, cursor in services.broker.subscribe(run_id, Cursor.parse(last_event_id)):
        yield ServerSentEvent(event=item.kind, data=item.data, id=cursor.encode())

"""A run's metrics and log: downsampled history, the live event stream, the kept log copy.

Each route checks the run exists for the caller and reads in one read transaction of its own;
the event stream checks in a short one and holds none while it streams.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import PlainTextResponse, Response
from fastapi.sse import EventSourceResponse, ServerSentEvent

from service.api.auth import (
    CredentialsDep,
    Principal,
    Viewer,
    client_of,
    require_visible,
    resolve,
)
from service.api.deps import INT64_MAX, Services, ServicesDep
from service.api.revocation import until_set
from service.errors import InvalidSpec, field_error
from service.metrics import logcopy, samples, store
from service.metrics.ansi import strip_ansi
from service.metrics.broker import Cursor, Item
from service.operations.step_time import step_time
from service.wire.documents import encode
from service.wire.metrics import LatestOut, SamplesPage, SeriesOut, StepTimeOut, sample_doc

router = APIRouter(prefix="/runs", tags=["metrics"])


@router.get("/{run_id}/metrics", response_model=SeriesOut)
def metric_series(
    services: ServicesDep,
    principal: Viewer,
    run_id: str,
    keys: Annotated[str | None, Query(description="comma-separated keys; all when absent")] = None,
    max_points: Annotated[int, Query(ge=2, le=100_000)] = 1000,
    from_step: Annotated[int | None, Query(ge=0, le=INT64_MAX)] = None,
    to_step: Annotated[int | None, Query(ge=0, le=INT64_MAX)] = None,
) -> Response:
    """History per key, all keys in one read. Above ``max_points`` steps, each point is an
    aligned bucket of a power-of-two number of steps: its last step and value with its min and
    max. NaN and infinities are the strings "NaN", "Infinity", "-Infinity"."""
    if from_step is not None and to_step is not None and to_step < from_step:
        msg = "to_step must not be below from_step"
        raise InvalidSpec(msg, [field_error(["query", "to_step"], msg)])
    limit = services.settings.metric_keys_per_request
    names = list(dict.fromkeys(k for k in (keys or "").split(",") if k))
    if len(names) > limit:
        msg = f"at most {limit} keys per request"
        raise InvalidSpec(msg, [field_error(["query", "keys"], msg)])
    with services.db.read() as session:
        require_visible(session, principal, run_id)
        chosen = names or list(store.keys_of(session, run_id))[:limit]
        found = store.series(session, run_id, chosen, max_points, from_step, to_step)
    # Serialised in one call (pydantic-core, no dict per point): a dashboard page of keys is
    # tens of thousands of points.
    body = encode({"run_id": run_id, "series": found})
    return Response(body, media_type="application/json")


@router.get("/{run_id}/step-time", response_model=StepTimeOut)
def run_step_time(services: ServicesDep, principal: Viewer, run_id: str) -> Response:
    """Where the run's step time goes (from verl's own timers), which group holds it back
    (``verdict``, with the figures behind it), the weight sync's trend and, where another split
    of its accelerators would help, the spec that makes it (checked by the dry-run planner)."""
    with services.db.read() as session:
        require_visible(session, principal, run_id)
    return Response(encode(step_time(services, principal, run_id)), media_type="application/json")


@router.get("/{run_id}/metrics/keys")
def metric_keys(services: ServicesDep, principal: Viewer, run_id: str) -> list[str]:
    """Every key the run has logged, sorted."""
    with services.db.read() as session:
        require_visible(session, principal, run_id)
        return list(store.keys_of(session, run_id))


@router.get("/{run_id}/metrics/latest", response_model=LatestOut)
def metric_latest(services: ServicesDep, principal: Viewer, run_id: str) -> Response:
    """Every key the run has logged with its value at the newest step it was logged (NaN and
    infinities as strings); ``step`` is the newest of those steps."""
    with services.db.read() as session:
        require_visible(session, principal, run_id)
        found = store.latest_every(session, run_id)
    latest = {k: {"step": s, "value": v} for k, (s, v) in found.items()}
    step = max((s for s, _ in found.values()), default=None)
    body = encode({"run_id": run_id, "step": step, "latest": latest})
    return Response(body, media_type="application/json")


@router.get("/{run_id}/samples", response_model=SamplesPage)
def run_samples(
    services: ServicesDep,
    principal: Viewer,
    run_id: str,
    step: Annotated[int | None, Query(ge=0, le=INT64_MAX)] = None,
    min_score: Annotated[float | None, Query(allow_inf_nan=False)] = None,
    max_score: Annotated[float | None, Query(allow_inf_nan=False)] = None,
    q: Annotated[
        str | None,
        Query(max_length=200, description="text in the prompt or the response (any case)"),
    ] = None,
    prompt_id: Annotated[str | None, Query(pattern=r"^[0-9a-f]{16}$")] = None,
    cursor: Annotated[int | None, Query(ge=0, le=INT64_MAX)] = None,
    limit: Annotated[int, Query(ge=1, le=samples.PAGE_MAX)] = 50,
    steps: Annotated[bool, Query(description="also the per-step counts and scores")] = False,
) -> Response:
    """The run's rollout samples, newest first, a page at a time (``next_cursor``)."""
    if min_score is not None and max_score is not None and max_score < min_score:
        msg = "max_score must not be below min_score"
        raise InvalidSpec(msg, [field_error(["query", "max_score"], msg)])
    query = samples.Query(step, min_score, max_score, q, prompt_id, cursor, limit)
    with services.db.read() as session:
        require_visible(session, principal, run_id)
        rows, next_cursor = samples.page(session, run_id, query)
        kept, chars, skipped = samples.counters(session, run_id)
        per_step = samples.steps(session, run_id) if steps else None
        doc = {
            "run_id": run_id,
            "items": [sample_doc(r) for r in rows],
            "next_cursor": next_cursor,
            "kept": kept,
            "chars": chars,
            "skipped": skipped,
            "steps": per_step,
        }
    return Response(encode(doc), media_type="application/json")


@router.get(
    "/{run_id}/logs",
    response_class=PlainTextResponse,
    responses={200: {"headers": {"Log-Offset": {}, "Log-Complete": {}}}},
)
def run_logs(
    services: ServicesDep,
    principal: Viewer,
    run_id: str,
    tail: Annotated[
        int | None, Query(ge=0, le=10_000_000, description="only the last N lines")
    ] = None,
    offset: Annotated[
        int | None,
        Query(ge=0, le=INT64_MAX, description="only what follows this offset (a Log-Offset)"),
    ] = None,
    ansi: Annotated[bool, Query(description="keep terminal colour codes")] = False,
) -> PlainTextResponse:
    """The service's own copy of the job log (the newest part, up to its configured size),
    without terminal escape codes unless ``ansi=true``. ``Log-Offset`` is where this answer
    ends (pass it as ``offset`` to read on); ``Log-Complete: true`` once nothing more will come."""
    with services.db.read() as session:
        require_visible(session, principal, run_id)
        if offset is not None:
            text, end = logcopy.since(session, run_id, offset)
        else:
            text, end = logcopy.tail(session, run_id, tail), logcopy.end(session, run_id)
        finished = logcopy.finished(session, run_id)
    headers = {"Log-Offset": str(end), "Log-Complete": str(finished).lower()}
    return PlainTextResponse(text if ansi else strip_ansi(text), headers=headers)


async def _stream_caller(
    services: ServicesDep, credentials: CredentialsDep, run_id: str, request: Request
) -> AsyncIterator[Principal]:
    """The caller, holding one of its stream slots until the stream ends (auth on)."""
    principal = await resolve(services, credentials, client_of(request))
    await run_in_threadpool(_ensure_visible, services, principal, run_id)
    if not services.settings.auth_enabled:
        yield principal
        return
    services.streams.take(principal.key, services.settings.streams_per_caller)
    try:
        yield principal
    finally:
        services.streams.give(principal.key)


def _ensure_visible(services: Services, principal: Principal, run_id: str) -> None:
    # Checked in its own short read: the stream must not hold a transaction open.
    with services.db.read() as session:
        require_visible(session, principal, run_id)


def _stream_start(
    services: ServicesDep,
    run_id: str,
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


async def _stream_items(
    services: ServicesDep,
    principal: Annotated[Principal, Depends(_stream_caller)],
    run_id: str,
    start: Annotated[Cursor, Depends(_stream_start)],
) -> AsyncIterator[AsyncIterator[tuple[Item, Cursor]]]:
    """The run's items for its stream, closed when the request ends: the endpoint, whose client
    may leave while it waits to hand over an event, is not always closed then, and a
    subscription left to the collector holds its upstream until it runs."""
    items = services.broker.subscribe(run_id, start)
    async with (
        _ended_on_revocation(services, principal) as revoked,
        contextlib.aclosing(until_set(revoked, items)) as stream,
    ):
        yield stream


@router.get(
    "/{run_id}/events",
    response_class=EventSourceResponse,
    responses={429: {"description": "too many live streams for this token"}},
)
async def run_events(
    stream: Annotated[AsyncIterator[tuple[Item, Cursor]], Depends(_stream_items)],
) -> AsyncIterator[ServerSentEvent]:
    """``status`` and ``metrics`` events (a metrics event carries its step and all its values):
    everything after ``Last-Event-ID`` (or from the start, or from now), then live ones; a last
    ``end`` event once the run has ended and its log is read to the end. Event ids are
    ``<status event id>-<log offset>`` (resume is exact for both)."""
    async for item, cursor in stream:
        # Encoded as the run's own answer encodes it (times, NaN): one serialiser.
        data = encode(item.data).decode()
        yield ServerSentEvent(event=item.kind, raw_data=data, id=cursor.encode())


def _ended_on_revocation(
    services: Services, principal: Principal
) -> AbstractAsyncContextManager[asyncio.Event]:
    """Set once the caller's API token is revoked (the stream then ends: a reconnection with
    it is a 401); never set in open mode or for an identity provider's JWT (it lives until
    its ``exp``)."""
    if principal.token_id is None or principal.token_id.startswith("oidc:"):
        return contextlib.nullcontext(asyncio.Event())
    return services.revocations.watching(services.db, principal.token_id)

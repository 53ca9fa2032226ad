"""Runs: accept (durably), list, read, cancel, retry.

Accepting and cancelling are ``service.operations``' (one short write transaction each, with
validation, Hydra composition and the cluster's inventory, a Ray call, done before it opens);
reads open their read transaction in the route body (see ``service.api.deps``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import replace
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Depends, Header, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from pydantic_core import to_json

from service.api.auth import Admin, Member, Principal, Viewer, client_of, ensure_sees
from service.api.deps import Services, ServicesDep
from service.api.json_answer import json_response
from service.api.read_cache import Answer, OneRun, Page, respond
from service.metrics import store
from service.operations import accept, cancel, over_budget, retry
from service.operations import baseline as _baseline
from service.operations.idempotency import Accepted
from service.operations.run_docs import SUMMARY_KEYS, run_doc, summary_doc
from service.store.runs import ended_attempts, page_query, run_page
from service.store.status import RunStatus
from service.wire.documents import encode
from service.wire.runs import BaselineOut, RunOut, RunPage

router = APIRouter(prefix="/runs", tags=["runs"])

SPEC_EXAMPLE = {"recipe": "tiny-grpo", "name": "my-first-run"}
# The headers' bounds (also where a request is answered before routing: service.api.direct).
MAX_IDEMPOTENCY_KEY = 200
MAX_IF_NONE_MATCH = 1000


@router.post(
    "",
    status_code=201,
    response_model=RunOut,
    responses={
        200: {"description": "dry run: the plan, nothing stored"},
        409: {"description": "Idempotency-Key reused with another body"},
        429: {
            "description": "the team submitted too many runs in the last minute, or the caller "
            "has too many specs being validated at once"
        },
    },
)
def create_run(
    services: ServicesDep,
    principal: Member,
    request: Request,
    body: Annotated[dict[str, Any], Body(examples=[SPEC_EXAMPLE])],
    _slot: ValidationSlot,
    dry_run: bool = False,
    idempotency_key: Annotated[str | None, Header(max_length=MAX_IDEMPOTENCY_KEY)] = None,
) -> Response:
    """Accept a run: validated, stored as QUEUED and committed before the answer.

    The team is the token's: a member may leave ``team`` out or name its own (another is a
    403); an admin may name any team. Priority ``high`` is an admin's, or a granted team's."""
    if dry_run:
        return JSONResponse(accept.plan_run(services, principal, body))
    return accepted(
        accept.accept_run(services, principal, body, idempotency_key, client_of(request))
    )


def accepted(done: Accepted) -> Response:
    """The answer to an accept: 201, the run, where it lives, and whether it was a replay."""
    headers = {"Location": f"/runs/{done.run_id}"}
    if done.replayed:
        headers["Idempotent-Replayed"] = "true"
    return json_response(done.doc, 201, headers)


def validation_slot_of(services: Services, principal: Principal) -> AbstractContextManager[None]:
    """One of the caller's few specs validated at once, taken on the event loop (a refusal costs
    no worker thread). A verl spec may need a full Hydra composition, one at a time in the
    process: one caller's many must not take every worker thread from the others. Auth on only:
    in open mode there is one caller."""
    if not services.settings.auth_enabled:
        return nullcontext()
    return services.validations.held(principal.key, services.settings.validations_per_caller)


async def validation_slot(services: ServicesDep, principal: Member) -> AsyncIterator[None]:
    with validation_slot_of(services, principal):
        yield


ValidationSlot = Annotated[None, Depends(validation_slot)]
# A page of runs reads its summaries' keys and those its baseline differences are taken on.
LIST_KEYS = tuple(dict.fromkeys((*SUMMARY_KEYS, *_baseline.KEYS)))


NOT_MODIFIED: dict[int | str, dict[str, Any]] = {
    304: {"description": "the answer the caller holds (`If-None-Match`) is current"}
}


@router.get("", response_model=RunPage, responses=NOT_MODIFIED)
async def list_runs(
    services: ServicesDep,
    principal: Viewer,
    status: Annotated[list[RunStatus] | None, Query()] = None,
    team: str | None = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: str | None = None,
    if_none_match: Annotated[str | None, Header(max_length=MAX_IF_NONE_MATCH)] = None,
    baseline: Annotated[
        bool, Query(description="with each run's difference from its team's and recipe's baseline")
    ] = False,
) -> Response:
    """A page of runs, newest first; pass ``next_cursor`` back as ``cursor`` for the next.
    A non-admin sees its own team's runs only. ``baseline=true`` adds each run's difference
    from its baseline (a query more, and one per compared value)."""
    if principal.role != "admin":
        team = principal.team
    query = page_query(bool(status), bool(team), bool(cursor))
    params = {"limit": limit + 1, "status": status, "team": team, "cursor": cursor}

    scope = Page(frozenset(status) if status else None, team, cursor)

    def read_page() -> Answer:
        with services.db.read() as session:
            rows = session.connection().execute(query, params).all()
            page = rows[:limit]
            keys = LIST_KEYS if baseline else SUMMARY_KEYS
            latest = store.latest_of_runs(session, [r.id for r in page], keys)
            compared = _baseline.diffs(session, page, latest) if baseline else {}
        items = [summary_doc(r, latest.get(r.id), compared.get(r.id)) for r in page]
        more = len(rows) > limit
        next_cursor = page[-1].id if more else None
        read_scope = replace(
            scope, read=frozenset(r.id for r in rows), oldest=rows[-1].id if more else None
        )
        return Answer(encode({"items": items, "next_cursor": next_cursor}), scope=read_scope)

    # The key is everything the page depends on, the team it is limited to included.
    key = f"runs:{to_json(params).decode()}" + (":baseline" if baseline else "")
    answer = await services.reads.answer(key, scope, lambda: services.db.run_read(read_page))
    return respond(answer, if_none_match)


@router.get("/{run_id}", response_model=RunOut, responses=NOT_MODIFIED)
async def get_run(
    services: ServicesDep,
    principal: Viewer,
    run_id: str,
    if_none_match: Annotated[str | None, Header(max_length=MAX_IF_NONE_MATCH)] = None,
    baseline: Annotated[
        bool, Query(description="with its difference from its team's and recipe's baseline")
    ] = False,
) -> Response:
    """The run with its progress and latest metrics (three queries, whatever the run holds;
    none while the run has not changed since the last caller read it); ``baseline=true``
    adds its difference from its baseline."""
    answer = await read_run(services, run_id, baseline)
    ensure_sees(principal, answer.team, run_id)
    return respond(answer, if_none_match)


async def read_run(services: Services, run_id: str, baseline: bool = False) -> Answer:
    """The answer of ``GET /runs/{run_id}``, kept or read (for any caller: check who sees it)."""

    async def read() -> Answer:
        run, events, latest = await run_page(services.db, run_id)
        ended = await ended_attempts(services.db, run)
        compared = None
        if baseline:
            compared = await services.db.run_read(lambda: _compared(services, run))
        return Answer(encode(run_doc(run, events, latest, ended, compared)), run.team)

    key = f"run:{run_id}" + (":baseline" if baseline else "")
    return await services.reads.answer(key, OneRun(run_id), read)


class CancelIn(BaseModel):
    """How an active run stops: now (``at: now``, as without a body), or right after its next
    complete checkpoint, waiting at most ``within_s`` seconds for it (default:
    RLRUN_DEFAULT_STOP_WITHIN_S, at most RLRUN_MAX_STOP_WITHIN_S)."""

    model_config = ConfigDict(extra="forbid")

    at: Literal["now", "next_checkpoint"] = "now"
    within_s: float | None = Field(None, ge=0, allow_inf_nan=False)


def _compared(services: Services, run: Any) -> dict[str, Any] | None:
    """The run's difference from its baseline (two small reads, and one a compared key)."""
    with services.db.read() as session:
        latest = store.latest_of_runs(session, [run.id], _baseline.KEYS)
        return _baseline.diffs(session, [run], latest).get(run.id)


@router.put("/{run_id}/baseline", response_model=BaselineOut)
def pin_baseline(
    services: ServicesDep, principal: Member, request: Request, run_id: str
) -> Response:
    """Make the run the baseline of its team and recipe (replacing the one before, audited):
    the team's other runs of that recipe show their difference from it at the same step."""
    return json_response(_baseline.pin(services, principal, run_id, client_of(request)))


@router.delete(
    "/{run_id}/baseline",
    status_code=204,
    responses={409: {"description": "the run is not the baseline"}},
)
def unpin_baseline(
    services: ServicesDep, principal: Member, request: Request, run_id: str
) -> Response:
    """Take the run off as the baseline of its team and recipe (audited)."""
    _baseline.unpin(services, principal, run_id, client_of(request))
    return Response(status_code=204)


@router.post(
    "/{run_id}/cancel",
    response_model=RunOut,
    responses={409: {"description": "the run has already ended"}},
)
def cancel_run(
    services: ServicesDep,
    principal: Member,
    request: Request,
    run_id: str,
    body: Annotated[CancelIn | None, Body()] = None,
) -> Response:
    """Queued: CANCELLED at once (Ray never sees it). Active: a stop is requested; with
    ``{"at": "next_checkpoint", "within_s": S}`` the run stops right after its next complete
    checkpoint, or after S seconds whatever it has saved, and ends STOPPED with the step it
    saved and the steps it lost (``stop``); ``retry`` resumes it from there."""
    doc = cancel.cancel_run(
        services,
        principal,
        run_id,
        client_of(request),
        at_checkpoint=body is not None and body.at == "next_checkpoint",
        within_s=body.within_s if body is not None else None,
    )
    return json_response(doc)


@router.post(
    "/{run_id}/admit-over-budget",
    response_model=RunOut,
    responses={409: {"description": "the run is no longer queued"}},
)
def admit_over_budget(
    services: ServicesDep, principal: Admin, request: Request, run_id: str
) -> Response:
    """Let a queued run start although its team is past its accelerator-hour budget this
    month (admins only, audited); it still waits for capacity and its team's quota."""
    doc = over_budget.admit_over_budget(services, principal, run_id, client_of(request))
    return json_response(doc)


class RetryIn(BaseModel):
    """What the next attempt starts from: the run's newest complete checkpoint, or scratch."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    from_: Literal["checkpoint", "scratch"] = Field("checkpoint", alias="from")


@router.post(
    "/{run_id}/retry",
    response_model=RunOut,
    responses={409: {"description": "the run has not ended"}},
)
def retry_run(
    services: ServicesDep,
    principal: Member,
    request: Request,
    run_id: str,
    body: Annotated[RetryIn | None, Body()] = None,
) -> Response:
    """An ended run's next attempt, now: QUEUED again at the head of its priority, as its own
    Ray job (``<run id>-a<N>``), resuming from its checkpoint unless asked ``from: scratch``."""
    resume = (body or RetryIn()).from_
    return json_response(retry.retry_run(services, principal, run_id, resume, client_of(request)))

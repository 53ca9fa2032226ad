"""Runs: accept (durably), list, read, cancel.

Each route opens its transaction in its body (see ``service.api.deps``): reads a read
transaction, accepting and cancelling one short write transaction, with validation, Hydra
composition and the cluster's inventory (a Ray call) done before it opens.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import AsyncIterator
from contextlib import nullcontext
from dataclasses import replace
from datetime import timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Header, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic_core import to_json
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.api.auth import Member, Principal, Viewer, audited, ensure_sees, visible_run
from service.api.deps import ServicesDep
from service.api.read_cache import Answer, OneRun, Page, respond
from service.errors import Conflict, Forbidden, InvalidSpec, TooManyRequests, field_error
from service.ids import new_run_id
from service.metrics import store
from service.recipes.base import LaunchContext
from service.scheduling import backlog
from service.scheduling.admission import QueuedRun
from service.scheduling.fit import never_fits
from service.scheduling.priority import PRIORITIES
from service.schemas import SUMMARY_KEYS, encode, json_response, run_doc, summary_doc
from service.settings import Settings
from service.store.lifecycle import accept, request_stop, transition
from service.store.models import Run, utcnow
from service.store.runs import RUN_COLUMNS, events_of, page_query, run_page
from service.store.status import TERMINAL, RunStatus
from service.store.team_lock import lock_team
from service.team_secrets import SecretStore, masked_runtime_env, masked_spec, missing_message
from service.wire import RunOut, RunPage

router = APIRouter(prefix="/runs", tags=["runs"])

SPEC_EXAMPLE = {"recipe": "tiny-grpo", "name": "my-first-run"}


def request_hash(body: Any) -> str:
    return hashlib.sha256(
        json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()


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
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
) -> Response:
    """Accept a run: validated, stored as QUEUED and committed before the answer.

    The team is the token's: a member may leave ``team`` out or name its own (another is a
    403); an admin may name any team. Priority ``high`` is an admin's, or a granted team's."""
    db = services.db
    digest = request_hash(body)
    key = _scoped_key(principal, idempotency_key)
    body = _with_team(body, principal)
    if key and not dry_run:
        # Only once the caller may make this run now: a replay answers no one the checks refuse.
        _check_priority(services.settings, principal, *_asked(body))
        with db.read() as session:
            replayed = _replay(session, key, digest)
        if replayed is not None:
            return replayed
    run_id = new_run_id()
    ctx = LaunchContext(run_id=run_id, stop_grace_s=services.settings.stop_grace_s)
    spec, launch = services.registry.build(body, ctx)
    _check_secrets(services.secrets, spec.team, spec.secrets)
    _check_priority(services.settings, principal, spec.team, spec.priority)
    quotas = backlog.quotas(services.settings)
    groups = backlog.node_groups(services.settings)
    inventory = services.cluster()
    refusal = None
    if inventory is not None:
        mine = groups.view(inventory, spec.team)  # a team mapped to nodes: only those
        refusal = never_fits(launch.shape, mine, spec.team, quotas.of(spec.team))
    if dry_run:
        candidate = QueuedRun(run_id, spec.team, PRIORITIES[spec.priority], launch.shape)
        with db.read() as session:
            plan = backlog.plan(session, inventory, candidate, quotas, utcnow(), groups)
        if refusal:
            plan |= {
                "feasible_ever": False,
                "reasons": [e["msg"] for e in refusal.extra["errors"]],
                "errors": refusal.extra["errors"],
                "suggestion": refusal.extra.get("suggestion"),
            }
        shown = launch.as_dict() | {"runtime_env": masked_runtime_env(launch.runtime_env)}
        body = {"dry_run": True, "spec": masked_spec(spec.model_dump(mode="json"))}
        return JSONResponse(body | launch_view(shown) | {"plan": plan})
    if refusal:
        raise refusal
    now = utcnow()
    run = Run(
        id=run_id,
        name=spec.name or f"{spec.recipe}-{run_id[-8:]}",
        recipe=spec.recipe,
        team=spec.team,
        priority=PRIORITIES[spec.priority],
        status=RunStatus.QUEUED,
        health="ok",
        spec=spec.model_dump(mode="json"),
        launch=launch.as_dict(),
        idempotency_key=key,
        request_hash=digest,
        created_by=principal.user,
        created_at=now,
        updated_at=now,
    )
    with db.transaction() as session:
        _check_rate(services.settings, session, spec.team)
        try:
            with session.begin_nested() if key else nullcontext():
                accepted = accept(session, run)
        except IntegrityError:
            # A concurrent request with the same Idempotency-Key won the race.
            replayed = _replay(session, key, digest) if key else None
            if replayed is None:
                raise
            return replayed
        audited(session, request, principal, "run.create", run_id=run_id, target=run.team)
    # Committed: the submitter sees the row. The answer is made after: on SQLite the
    # transaction holds the one write lock, so nothing that needs no database happens in it.
    services.wake("submitter")
    return json_response(run_doc(run, [accepted]), 201, {"Location": f"/runs/{run_id}"})


async def validation_slot(services: ServicesDep, principal: Member) -> AsyncIterator[None]:
    """One of the caller's few specs validated at once, taken on the event loop (a refusal costs
    no worker thread). A verl spec may need a full Hydra composition, one at a time in the
    process: one caller's many must not take every worker thread from the others. Auth on only:
    in open mode there is one caller."""
    if not services.settings.auth_enabled:
        yield
        return
    with services.validations.held(principal.key, services.settings.validations_per_caller):
        yield


ValidationSlot = Annotated[None, Depends(validation_slot)]


def launch_view(launch: dict[str, Any]) -> dict[str, Any]:
    """A launch in the API's words: ``command`` (the argv list), as a run answers."""
    view = dict(launch)
    view["command"] = view.pop("argv")
    return view


def _with_team(body: Any, principal: Principal) -> Any:
    """The body with the token's team; a member naming another team is refused."""
    if not isinstance(body, dict) or principal.team is None:
        return body
    asked = body.get("team")
    if asked is None:
        return {**body, "team": principal.team}
    if asked != principal.team and principal.role != "admin":
        raise Forbidden(f"this token submits for team {principal.team!r} only")
    return body


def _asked(body: Any) -> tuple[str, str]:
    """The team and priority a body asks for, as the spec will read them (defaults if absent
    or not strings: the spec's own validation refuses those later)."""
    team = body.get("team") if isinstance(body, dict) else None
    priority = body.get("priority") if isinstance(body, dict) else None
    return (
        team if isinstance(team, str) else "default",
        priority if isinstance(priority, str) else "normal",
    )


def _check_secrets(secrets: SecretStore, team: str, refs: dict[str, str]) -> None:
    """Every secret named is in the service's store now (it is read again at submit time)."""
    errors = [
        field_error(
            ["secrets", var],
            missing_message(refs[var]),
            "unknown_secret",
        )
        for var in secrets.unknown(team, refs)
    ]
    if errors:
        raise InvalidSpec(errors[0]["msg"], errors)


def _check_priority(settings: Settings, principal: Principal, team: str, priority: str) -> None:
    if priority != "high" or principal.role == "admin" or team in settings.high_priority_teams:
        return
    raise Forbidden(
        "priority high needs an admin, or a team granted it (RLRUN_HIGH_PRIORITY_TEAMS)"
    )


def _check_rate(settings: Settings, session: Session, team: str) -> None:
    """At most ``runs_per_team_per_minute`` accepted runs per team in any minute (auth on)."""
    limit = settings.runs_per_team_per_minute
    if not limit or not settings.auth_enabled:
        return
    # Counted under the team's lock, held until this accept commits: exact under concurrency.
    lock_team(session, team)
    since = utcnow() - timedelta(minutes=1)
    count, oldest = session.execute(
        select(func.count(), func.min(Run.created_at)).where(
            Run.team == team, Run.created_at > since
        )
    ).one()
    if count >= limit:
        wait = 60 - (utcnow() - oldest).total_seconds() if oldest else 60
        raise TooManyRequests(
            f"team {team!r} submitted {count} runs in the last minute (limit {limit})",
            retry_after_s=max(1, math.ceil(wait)),
        )


def _scoped_key(principal: Principal, key: str | None) -> str | None:
    """Idempotency keys are the caller's own, by its identity (the API token's id, or the
    digest of an OIDC issuer and subject): another caller's equal key is another key, even
    under the same user and team names. An empty key is no key."""
    if not key:
        return None
    return hashlib.sha256(f"{principal.key}\0{key}".encode()).hexdigest()


def _replay(session: Session, key: str, digest: str) -> Response | None:
    """The answer for an Idempotency-Key already used, or None if it was not."""
    run = session.execute(
        select(*RUN_COLUMNS, Run.request_hash).where(Run.idempotency_key == key)
    ).one_or_none()
    if run is None:
        return None
    if run.request_hash != digest:
        raise Conflict(
            "this Idempotency-Key was used with a different request body",
            run_id=run.id,
        )
    headers = {"Location": f"/runs/{run.id}", "Idempotent-Replayed": "true"}
    return json_response(run_doc(run, events_of(session, run.id)), 201, headers)


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
    if_none_match: Annotated[str | None, Header(max_length=1000)] = None,
) -> Response:
    """A page of runs, newest first; pass ``next_cursor`` back as ``cursor`` for the next.
    A non-admin sees its own team's runs only."""
    if principal.role != "admin":
        team = principal.team
    query = page_query(bool(status), bool(team), bool(cursor))
    params = {"limit": limit + 1, "status": status, "team": team, "cursor": cursor}

    scope = Page(frozenset(status) if status else None, team, cursor)

    def read() -> Answer:
        with services.db.read() as session:
            rows = session.connection().execute(query, params).all()
            page = rows[:limit]
            latest = store.latest_of_runs(session, [r.id for r in page], SUMMARY_KEYS)
        items = [summary_doc(r, latest.get(r.id)) for r in page]
        more = len(rows) > limit
        next_cursor = page[-1].id if more else None
        read_scope = replace(
            scope, read=frozenset(r.id for r in rows), oldest=rows[-1].id if more else None
        )
        return Answer(encode({"items": items, "next_cursor": next_cursor}), scope=read_scope)

    # The key is everything the page depends on, the team it is limited to included.
    answer = await services.reads.answer(f"runs:{to_json(params).decode()}", scope, read)
    return respond(answer, if_none_match)


@router.get("/{run_id}", response_model=RunOut, responses=NOT_MODIFIED)
async def get_run(
    services: ServicesDep,
    principal: Viewer,
    run_id: str,
    if_none_match: Annotated[str | None, Header(max_length=1000)] = None,
) -> Response:
    """The run with its progress and latest metrics (three queries, whatever the run holds;
    none while the run has not changed since the last caller read it)."""

    def read() -> Answer:
        run, events, latest = run_page(services.db, run_id)
        return Answer(encode(run_doc(run, events, latest)), run.team)

    answer = await services.reads.answer(f"run:{run_id}", OneRun(run_id), read)
    ensure_sees(principal, answer.team, run_id)
    return respond(answer, if_none_match)


@router.post(
    "/{run_id}/cancel",
    response_model=RunOut,
    responses={409: {"description": "the run has already ended"}},
)
def cancel_run(services: ServicesDep, principal: Member, request: Request, run_id: str) -> Response:
    """Queued: CANCELLED at once (Ray never sees it). Active: a stop is requested."""
    wake = None
    with services.db.transaction() as session:
        run = visible_run(session, principal, run_id, lock=True)
        if run.status in TERMINAL:
            raise Conflict(f"run {run_id} is already {run.status}", status_of_run=run.status)
        if run.status == RunStatus.QUEUED:
            transition(session, run, RunStatus.CANCELLED, "cancelled before submission")
            # Its place in the queue is free: let the runs behind it move up now.
            wake = "submitter"
        elif request_stop(session, run):
            wake = "reconciler"
        audited(session, request, principal, "run.cancel", run_id=run.id, target=run.team)
        doc = run_doc(run, events_of(session, run_id))
    if wake:
        services.wake(wake)
    return json_response(doc)

"""Runs: accept (durably), list, read, cancel."""

from __future__ import annotations

import hashlib
import json
import math
from datetime import timedelta
from typing import Annotated, Any

from fastapi import APIRouter, BackgroundTasks, Body, Header, Query, Request, Response
from fastapi.responses import JSONResponse
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.api.auth import Member, Principal, Viewer, audited, visible_run
from service.api.deps import InventoryDep, ServicesDep, SessionDep
from service.errors import Conflict, Forbidden, TooManyRequests
from service.ids import new_run_id
from service.metrics import store
from service.recipes.base import PRIORITIES, LaunchContext
from service.scheduling import backlog
from service.scheduling.admission import QueuedRun
from service.scheduling.fit import never_fits
from service.schemas import SUMMARY_KEYS, run_out, run_summary
from service.secrets import masked_runtime_env, masked_spec
from service.settings import Settings
from service.store.lifecycle import note, transition
from service.store.models import Run, RunEvent, utcnow
from service.store.runs import events_of
from service.store.status import ACTIVE, TERMINAL, RunStatus
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
        429: {"description": "the team submitted too many runs in the last minute"},
    },
)
def create_run(
    services: ServicesDep,
    inventory: InventoryDep,
    session: SessionDep,
    principal: Member,
    request: Request,
    response: Response,
    background: BackgroundTasks,
    body: Annotated[dict[str, Any], Body(examples=[SPEC_EXAMPLE])],
    dry_run: bool = False,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
) -> Any:
    """Accept a run: validated, stored as QUEUED and committed before the answer.

    The team is the token's: a member may leave ``team`` out or name its own (another is a
    403); an admin may name any team. Priority ``high`` is an admin's, or a granted team's."""
    digest = request_hash(body)
    key = _scoped_key(principal, idempotency_key)
    if key and not dry_run:
        existing = session.scalar(select(Run).where(Run.idempotency_key == key))
        if existing is not None:
            return _replay(session, existing, digest, response)
    run_id = new_run_id()
    ctx = LaunchContext(run_id=run_id, stop_grace_s=services.settings.stop_grace_s)
    spec, launch = services.registry.build(_with_team(body, principal), ctx)
    _check_priority(services.settings, principal, spec.team, spec.priority)
    if not dry_run:
        _check_rate(services.settings, session, spec.team)
    quotas = backlog.quotas(services.settings)
    refusal = None
    if inventory is not None:
        refusal = never_fits(launch.shape, inventory, spec.team, quotas.of(spec.team))
    if refusal and not dry_run:
        raise refusal
    if dry_run:
        candidate = QueuedRun(run_id, spec.team, PRIORITIES[spec.priority], launch.shape)
        plan = backlog.plan(session, inventory, candidate, quotas, utcnow())
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
    run = Run(
        id=run_id,
        name=spec.name or f"{spec.recipe}-{run_id[-8:]}",
        recipe=spec.recipe,
        team=spec.team,
        priority=PRIORITIES[spec.priority],
        status=RunStatus.QUEUED,
        spec=spec.model_dump(mode="json"),
        launch=launch.as_dict(),
        idempotency_key=key,
        request_hash=digest,
    )
    try:
        with session.begin_nested():
            session.add(run)
            session.flush()
    except IntegrityError:
        # A concurrent request with the same Idempotency-Key won the race.
        existing = session.scalar(select(Run).where(Run.idempotency_key == key))
        if existing is None:
            raise
        return _replay(session, existing, digest, response)
    session.add(
        RunEvent(
            run_id=run.id,
            at=run.created_at,
            from_status=None,
            to_status=RunStatus.QUEUED,
            reason="accepted",
        )
    )
    session.flush()
    audited(session, request, principal, "run.create", run_id=run.id, target=run.team)
    response.headers["Location"] = f"/runs/{run.id}"
    # After the response, so the submitter sees the committed row.
    background.add_task(services.wake, "submitter")
    return run_out(run, events_of(session, run.id))


def launch_view(launch: dict[str, Any]) -> dict[str, Any]:
    """A stored launch in the API's words: ``command`` (the argv list), as a run answers."""
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
    """Idempotency keys are the caller's own: another user's equal key is another key."""
    if not key or principal.token_id is None:
        return key
    return hashlib.sha256(f"{principal.team}\0{principal.user}\0{key}".encode()).hexdigest()


def _replay(session: Session, run: Run, digest: str, response: Response) -> RunOut:
    if run.request_hash != digest:
        raise Conflict(
            "this Idempotency-Key was used with a different request body",
            run_id=run.id,
        )
    response.headers["Location"] = f"/runs/{run.id}"
    response.headers["Idempotent-Replayed"] = "true"
    return run_out(run, events_of(session, run.id))


@router.get("", response_model=RunPage)
def list_runs(
    session: SessionDep,
    principal: Viewer,
    status: Annotated[list[RunStatus] | None, Query()] = None,
    team: str | None = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: str | None = None,
) -> RunPage:
    """A page of runs, newest first; pass ``next_cursor`` back as ``cursor`` for the next.
    A non-admin sees its own team's runs only."""
    if principal.role != "admin":
        team = principal.team
    query = select(Run).order_by(Run.id.desc()).limit(limit + 1)
    if status:
        query = query.where(Run.status.in_(status))
    if team:
        query = query.where(Run.team == team)
    if cursor:
        query = query.where(Run.id < cursor)
    rows = list(session.scalars(query))
    page = rows[:limit]
    latest = store.latest_of_runs(session, [r.id for r in page], SUMMARY_KEYS)
    return RunPage(
        items=[run_summary(r, latest.get(r.id)) for r in page],
        next_cursor=page[-1].id if len(rows) > limit else None,
    )


@router.get("/{run_id}", response_model=RunOut)
def get_run(session: SessionDep, principal: Viewer, run_id: str) -> RunOut:
    """The run with its progress and latest metrics."""
    run = visible_run(session, principal, run_id)
    return run_out(run, events_of(session, run_id), store.latest(session, run_id))


@router.post(
    "/{run_id}/cancel",
    response_model=RunOut,
    responses={409: {"description": "the run has already ended"}},
)
def cancel_run(
    services: ServicesDep,
    session: SessionDep,
    principal: Member,
    request: Request,
    background: BackgroundTasks,
    run_id: str,
) -> RunOut:
    """Queued: CANCELLED at once (Ray never sees it). Active: a stop is requested."""
    run = visible_run(session, principal, run_id, lock=True)
    if run.status in TERMINAL:
        raise Conflict(f"run {run_id} is already {run.status}", status_of_run=run.status)
    if run.status == RunStatus.QUEUED:
        transition(session, run, RunStatus.CANCELLED, "cancelled before submission")
        # Its place in the queue is free: let the runs behind it move up now.
        background.add_task(services.wake, "submitter")
    elif run.status in ACTIVE and run.stop_requested_at is None:
        run.stop_requested_at = utcnow()
        note(session, run, "stop requested")
        background.add_task(services.wake, "reconciler")
    audited(session, request, principal, "run.cancel", run_id=run.id, target=run.team)
    return run_out(run, events_of(session, run_id))

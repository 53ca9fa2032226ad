"""Runs: accept (durably), list, read, cancel."""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any

from fastapi import APIRouter, BackgroundTasks, Body, Header, Query, Response
from fastapi.responses import JSONResponse
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.api.deps import InventoryDep, ServicesDep, SessionDep
from service.errors import Conflict
from service.ids import new_run_id
from service.metrics import store
from service.recipes.base import PRIORITIES, LaunchContext
from service.scheduling import backlog
from service.scheduling.admission import QueuedRun
from service.scheduling.fit import never_fits
from service.schemas import SUMMARY_KEYS, run_out, run_summary
from service.store.lifecycle import accept, request_stop, transition
from service.store.models import Run, utcnow
from service.store.runs import events_of, load_run
from service.store.status import TERMINAL, RunStatus
from service.wire import RunOut, RunPage

router = APIRouter(prefix="/runs", tags=["runs"])

SPEC_EXAMPLE = {"recipe": "tiny-grpo", "name": "my-first-run", "team": "default"}


def request_hash(body: Any) -> str:
    return hashlib.sha256(
        json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()


@router.post(
    "",
    status_code=201,
    response_model=RunOut,
    responses={200: {"description": "dry run: the plan, nothing stored"}, 409: {}, 422: {}},
)
def create_run(
    services: ServicesDep,
    inventory: InventoryDep,
    session: SessionDep,
    response: Response,
    background: BackgroundTasks,
    body: Annotated[dict[str, Any], Body(examples=[SPEC_EXAMPLE])],
    dry_run: bool = False,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
) -> Any:
    """Accept a run: validated, stored as QUEUED and committed before the answer."""
    digest = request_hash(body)
    if idempotency_key and not dry_run:
        existing = session.scalar(select(Run).where(Run.idempotency_key == idempotency_key))
        if existing is not None:
            return _replay(session, existing, digest, response)
    run_id = new_run_id()
    ctx = LaunchContext(run_id=run_id, stop_grace_s=services.settings.stop_grace_s)
    spec, launch = services.registry.build(body, ctx)
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
        return JSONResponse(
            {"dry_run": True, "spec": spec.model_dump(mode="json"), **launch_view(launch.as_dict())}
            | {"plan": plan}
        )
    run = Run(
        id=run_id,
        name=spec.name or f"{spec.recipe}-{run_id[-8:]}",
        recipe=spec.recipe,
        team=spec.team,
        priority=PRIORITIES[spec.priority],
        status=RunStatus.QUEUED,
        spec=spec.model_dump(mode="json"),
        launch=launch.as_dict(),
        idempotency_key=idempotency_key,
        request_hash=digest,
    )
    try:
        with session.begin_nested():
            session.add(run)
            session.flush()
    except IntegrityError:
        # A concurrent request with the same Idempotency-Key won the race.
        existing = session.scalar(select(Run).where(Run.idempotency_key == idempotency_key))
        if existing is None:
            raise
        return _replay(session, existing, digest, response)
    accept(session, run)
    response.headers["Location"] = f"/runs/{run.id}"
    # After the response, so the submitter sees the committed row.
    background.add_task(services.wake, "submitter")
    return run_out(run, events_of(session, run.id))


def launch_view(launch: dict[str, Any]) -> dict[str, Any]:
    """A stored launch in the API's words: ``command`` (the argv list), as a run answers."""
    view = dict(launch)
    view["command"] = view.pop("argv")
    return view


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
    status: Annotated[list[RunStatus] | None, Query()] = None,
    team: str | None = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: str | None = None,
) -> RunPage:
    """A page of runs, newest first; pass ``next_cursor`` back as ``cursor`` for the next."""
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
def get_run(session: SessionDep, run_id: str) -> RunOut:
    """The run with its progress and latest metrics."""
    run = load_run(session, run_id)
    return run_out(run, events_of(session, run_id), store.latest(session, run_id))


@router.post("/{run_id}/cancel", response_model=RunOut)
def cancel_run(
    services: ServicesDep, session: SessionDep, background: BackgroundTasks, run_id: str
) -> RunOut:
    """Queued: CANCELLED at once (Ray never sees it). Active: a stop is requested."""
    run = load_run(session, run_id, lock=True)
    if run.status in TERMINAL:
        raise Conflict(f"run {run_id} is already {run.status}", status_of_run=run.status)
    if run.status == RunStatus.QUEUED:
        transition(session, run, RunStatus.CANCELLED, "cancelled before submission")
        # Its place in the queue is free: let the runs behind it move up now.
        background.add_task(services.wake, "submitter")
    elif request_stop(session, run):
        background.add_task(services.wake, "reconciler")
    return run_out(run, events_of(session, run_id))

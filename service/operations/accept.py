"""Accepting a run: the caller's team and priority, the spec built by its recipe, its secrets,
whether its shape can ever fit, the team's rate, then the run stored as QUEUED and committed.
A dry run stops before storing and answers the plan instead.

Validation, Hydra composition and the cluster's inventory (a Ray call) come before the one short
write transaction; the dry run's plan is read in a read transaction.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any
from weakref import WeakKeyDictionary

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.cluster.registry import cluster_quotas
from service.errors import Forbidden, InvalidSpec, TooManyRequests, field_error
from service.ids import new_run_id
from service.operations.idempotency import Accepted, replay, request_hash, scoped_key
from service.operations.parts import Parts
from service.operations.run_docs import run_doc
from service.principal import Principal, call_entry
from service.recipes.base import Launch, LaunchContext, RunSpec
from service.recipes.verl import versions
from service.recovery import policy
from service.scheduling import backlog
from service.scheduling.admission import QueuedRun, Quotas
from service.scheduling.budgets import Budgets
from service.scheduling.fit import never_fits
from service.scheduling.inventory import Inventory
from service.scheduling.node_groups import NodeGroups
from service.scheduling.priority import PRIORITIES
from service.settings import Settings
from service.store.audit import record
from service.store.db import Database
from service.store.group_commit import GroupCommit
from service.store.lifecycle import accept
from service.store.models import Run, RunEvent, utcnow
from service.store.status import RunStatus
from service.store.team_lock import lock_team
from service.team_secrets import SecretStore, masked_runtime_env, masked_spec, missing_message


def accept_run(
    parts: Parts,
    principal: Principal,
    body: Any,
    idempotency_key: str | None,
    client: str | None,
) -> Accepted:
    """Accept a run: validated, stored as QUEUED and committed before it returns.

    The team is the principal's: a member may leave ``team`` out or name its own (another is a
    403); an admin may name any team. Priority ``high`` is an admin's, or a granted team's.
    ``client`` is the caller's address, for the audit trail."""
    db = parts.db
    digest = request_hash(body)
    key = scoped_key(principal, idempotency_key)
    body = _with_team(body, principal)
    if key:
        # Only once the caller may make this run now: a replay answers no one the checks refuse.
        _check_priority(parts.settings, principal, *_asked(body))
        with db.read() as session:
            replayed = replay(session, key, digest)
        if replayed is not None:
            return replayed
    built = _build(parts, principal, body)
    if built.refusal:
        raise built.refusal
    run_id, spec, launch = built.run_id, built.spec, built.launch
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
        launch=launch.as_dict()
        | {
            "where": built.where,
            "shared_on": parts.clusters.shared_among(spec.team, built.candidates),
        },
        idempotency_key=key,
        request_hash=digest,
        created_by=principal.user,
        created_at=now,
        updated_at=now,
    )
    stored = accepts_of(db).write(_Pending(parts.settings, db, run, principal, client))
    if isinstance(stored, Accepted):  # a concurrent request with the same key won the race
        return stored
    # Committed: the submitter sees the row. The answer is made after: on SQLite the
    # transaction holds the one write lock, so nothing that needs no database happens in it.
    parts.wake("submitter")
    return Accepted(run_id, run_doc(run, [stored]))


@dataclass(frozen=True)
class _Pending:
    """A run to store, built and checked; what its accept is audited with."""

    settings: Settings
    db: Database
    run: Run
    principal: Principal
    client: str | None


# Accepts that arrive while others commit are stored together, per database (group commit).
_ACCEPTS: WeakKeyDictionary[Database, GroupCommit[_Pending, RunEvent | Accepted]]
_ACCEPTS = WeakKeyDictionary()
_ACCEPTS_LOCK = threading.Lock()


def accepts_of(db: Database) -> GroupCommit[_Pending, RunEvent | Accepted]:
    """The group commit of accepts on ``db`` (its counts are on ``/metrics``)."""
    with _ACCEPTS_LOCK:
        if db not in _ACCEPTS:
            _ACCEPTS[db] = GroupCommit(_store_all)
        return _ACCEPTS[db]


def _store_all(batch: Sequence[_Pending]) -> list[RunEvent | Accepted | BaseException]:
    """Each run stored, all in one transaction: its first event, or its replay. A batch that
    meets a unique key (an Idempotency-Key a concurrent request took) is stored again one run
    at a time, so that only that run meets it; any other error is every run's."""
    if len(batch) > 1:
        try:
            return _store(batch)
        except IntegrityError:
            pass
    answers: list[RunEvent | Accepted | BaseException] = []
    for pending in batch:
        try:
            answers += _store([pending])
        except Exception as exc:
            answers.append(exc)
    return answers


def _store(batch: Sequence[_Pending]) -> list[RunEvent | Accepted | BaseException]:
    first = batch[0]
    # Alone, a run with a key that is taken meanwhile is answered as a replay of that run.
    key = first.run.idempotency_key if len(batch) == 1 else None
    with first.db.transaction() as session:
        answers = _over_rate(first.settings, session, batch)
        runs = [p for p, refused in zip(batch, answers, strict=True) if refused is None]
        try:
            with session.begin_nested() if key else nullcontext():
                events = iter(accept(session, [p.run for p in runs]))
        except IntegrityError:
            replayed = replay(session, key, first.run.request_hash or "") if key else None
            if replayed is None:
                raise
            return [replayed]
        record(
            session,
            *(call_entry(p.principal, p.client, "run.create", p.run.id, p.run.team) for p in runs),
        )
    return [refused or next(events) for refused in answers]


def plan_run(parts: Parts, principal: Principal, body: Any) -> dict[str, Any]:
    """A dry run: the spec and launch as they would be accepted (secrets masked) and the
    admission plan (fits now, ever, where); nothing stored. The same checks as an accept, but a
    shape that can never fit is part of the plan rather than a refusal."""
    body = _with_team(body, principal)
    built = _build(parts, principal, body)
    spec, launch, refusal = built.spec, built.launch, built.refusal
    candidate = QueuedRun(built.run_id, spec.team, PRIORITIES[spec.priority], launch.shape)
    clusters = parts.clusters
    # Several clusters: each one's state as the submitter's round reads it (inventories first,
    # outside the transaction; a down cluster's is not asked).
    views = [
        backlog.ClusterView(
            h.name, parts.cluster(h.name), h.health.down_reason, cluster_quotas(h.spec)
        )
        for h in (clusters if len(clusters) > 1 else ())
    ]
    with parts.db.read() as session:
        if len(clusters) == 1:
            plan = backlog.plan(
                session, built.inventory, candidate, built.quotas, utcnow(), built.groups
            )
            policy = backlog.preemption_policy(parts.settings)
            if policy is not None:
                plan |= backlog.plan_preemption(
                    session,
                    built.inventory,
                    candidate,
                    plan,
                    built.quotas,
                    policy,
                    launch,
                    clusters.primary.name,
                )
        else:
            now = utcnow()
            rows = backlog.queued(session, now)
            states = backlog.cluster_states(session, now, views, built.groups)
            candidates = {
                r.run.id: clusters.for_queued(r.run.team, r.launch, r.cluster) for r in rows
            } | {candidate.id: built.candidates}
            plan = backlog.plan_across(
                states, [r.run for r in rows], candidates, candidate, built.quotas
            )
        budgets = Budgets.of_settings(parts.settings)
        queued = backlog.QueuedRow(candidate, "", {}, None)
        over_budget = budgets.held_back(session, [queued], utcnow())
    if over_budget:
        plan |= {"feasible_now": False, "reasons": [o.reason for o in over_budget.values()]}
    if refusal:
        plan |= {
            "feasible_ever": False,
            "reasons": [e["msg"] for e in refusal.extra["errors"]],
            "errors": refusal.extra["errors"],
            "suggestion": refusal.extra.get("suggestion"),
        }
    shown = launch.as_dict() | {"runtime_env": masked_runtime_env(launch.runtime_env)}
    doc = {"dry_run": True, "spec": masked_spec(spec.model_dump(mode="json"))}
    return doc | launch_view(shown) | {"plan": plan}


def launch_view(launch: dict[str, Any]) -> dict[str, Any]:
    """A launch in the API's words: ``command`` (the argv list), as a run answers."""
    view = dict(launch)
    view["command"] = view.pop("argv")
    return view


@dataclass(frozen=True)
class _Built:
    """A body built into a spec and a launch, checked, with what its fit was judged against."""

    run_id: str
    spec: RunSpec
    launch: Launch
    inventory: Inventory | None
    quotas: Quotas
    groups: NodeGroups
    refusal: InvalidSpec | None  # the shape can never fit (None: it can, or Ray is away)
    # What the spec asks of a cluster, kept with the launch (the submitter reads it each round).
    where: dict[str, Any]
    candidates: list[str]  # the clusters the run may go to, in declared order


def _build(parts: Parts, principal: Principal, body: Any) -> _Built:
    """The spec and launch of ``body`` (with its team), its secrets and priority checked, the
    clusters it may go to, and whether its shape can ever fit one of them (read outside any
    transaction)."""
    run_id = new_run_id()
    ctx = LaunchContext(run_id=run_id, stop_grace_s=parts.settings.stop_grace_s)
    spec, launch = parts.registry.build(body, ctx)
    _check_secrets(parts.secrets, spec.team, spec.secrets)
    _check_priority(parts.settings, principal, spec.team, spec.priority)
    settings = parts.settings
    policy.check(
        spec.model_dump(include={"retry"}),
        spec.team,
        settings.team_retry_max_attempts,
        settings.retry_max_attempts,
    )
    where = _where(spec)
    candidates = parts.clusters.candidates(
        spec.team,
        where["cluster"],
        where["accelerator"],
        where["labels"],
        where["verl_version"],
        launch.reads,
        bool(spec.secrets),
    )
    if spec.secrets and (readers := parts.clusters.secret_readers(spec.team, candidates)):
        launch = replace(launch, warnings=[*launch.warnings, *readers])
    if shared := parts.clusters.shared_record(spec.team, candidates):
        launch = replace(launch, warnings=[*launch.warnings, *shared])
    quotas = backlog.quotas(parts.settings)
    groups = backlog.node_groups(parts.settings)
    primary = parts.clusters.primary.name
    inventory, refusal, chosen, unread = None, None, None, False
    # A shape refused only when every cluster it may go to was read and none can ever hold it;
    # planned on the first that can.
    for name in candidates:
        found = parts.cluster(name)
        if found is None:
            unread = True
            continue
        # A team mapped to nodes of the primary cluster: only those.
        mine = groups.view(found, spec.team) if name == primary else found
        inventory = inventory or found
        never = never_fits(launch.shape, mine, spec.team, quotas.of(spec.team))
        if never is None:
            inventory, chosen = found, name
            break
        refusal = refusal or never
    if chosen is not None or unread:
        refusal = None
    return _Built(run_id, spec, launch, inventory, quotas, groups, refusal, where, candidates)


def _where(spec: RunSpec) -> dict[str, Any]:
    """What ``spec`` asks of a cluster: its name, the selector, the verl version it needs."""
    version = getattr(spec, "verl_version", None)
    if version is None and hasattr(spec, "verl_version"):  # a verl spec: the service's own
        version = versions.installed()
    placement = spec.placement
    return {
        "cluster": spec.cluster,
        "accelerator": placement.accelerator if placement else None,
        "labels": dict(placement.labels) if placement else {},
        "verl_version": version,
    }


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


def _over_rate(
    settings: Settings, session: Session, batch: Sequence[_Pending]
) -> list[TooManyRequests | None]:
    """Per run, in order: refused if its team has had ``runs_per_team_per_minute`` accepted
    runs in the last minute, counting the runs before it in ``batch`` (auth on)."""
    limit = settings.runs_per_team_per_minute
    if not limit or not settings.auth_enabled:
        return [None] * len(batch)
    since = utcnow() - timedelta(minutes=1)
    recent: dict[str, tuple[int, datetime | None]] = {}  # the team's count, its oldest run
    # Counted under the teams' locks (taken in one order), held until the batch commits: exact
    # under concurrency.
    for team in sorted({p.run.team for p in batch}):
        lock_team(session, team)
        count, oldest = session.execute(
            select(func.count(), func.min(Run.created_at)).where(
                Run.team == team, Run.created_at > since
            )
        ).one()
        recent[team] = (count, oldest)
    refusals: list[TooManyRequests | None] = []
    for pending in batch:
        team = pending.run.team
        taken, first = recent[team]
        if taken >= limit:
            wait = 60 - (utcnow() - first).total_seconds() if first else 60
            refusals.append(
                TooManyRequests(
                    f"team {team!r} submitted {taken} runs in the last minute (limit {limit})",
                    retry_after_s=max(1, math.ceil(wait)),
                )
            )
        else:
            recent[team] = (taken + 1, first or pending.run.created_at)
            refusals.append(None)
    return refusals

"""Webhook subscriptions: a member's for its team's runs, an admin's for any team or all.

The secret (``whsec_...``, Standard Webhooks) is shown when it is made or rotated, never again;
after a rotation the previous secret also signs for the overlap asked for, so receivers can
switch without missing a message.
"""

from __future__ import annotations

import base64
import secrets
from collections.abc import Sequence
from datetime import timedelta
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, Field, ValidationError, ValidationInfo, field_validator
from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from service.api.auth import Member, Principal, Viewer, audited
from service.api.deps import ServicesDep
from service.clock import utcnow
from service.errors import Forbidden, InvalidSpec, NotFound, field_error, invalid_from_pydantic
from service.notify.guard import AllowList, UnsafeUrl, check
from service.notify.outbox import EVENT_TYPES, EventType
from service.notify.standing import Standing, standing
from service.notify.thresholds import rule_id
from service.store.models import Webhook, WebhookAttempt, WebhookDelivery, WebhookThreshold
from service.store.status import RunStatus
from service.wire.webhooks import (
    AttemptOut,
    DeliveryOut,
    NewSecret,
    NewWebhook,
    Threshold,
    WebhookOut,
)

router = APIRouter(tags=["webhooks"])

_PRINTABLE = r"^[^\x00-\x1f\x7f]*$"


class Rules(BaseModel):
    events: list[EventType] = Field(min_length=1, max_length=len(EVENT_TYPES))
    statuses: list[RunStatus] = Field(
        default_factory=list, description="run.status only for these (all when empty)"
    )
    recipe: str | None = Field(default=None, max_length=64, pattern=_PRINTABLE)
    name_pattern: str | None = Field(
        default=None, max_length=200, pattern=_PRINTABLE, description="a glob on the run's name"
    )
    thresholds: list[Threshold] = Field(
        default_factory=list,
        max_length=20,
        validate_default=True,
        description="the rules of metric.threshold",
    )

    @field_validator("thresholds")
    @classmethod
    def _thresholds_with_their_event(
        cls, value: list[Threshold], info: ValidationInfo
    ) -> list[Threshold]:
        wanted = "metric.threshold" in info.data.get("events", [])
        if wanted and not value:
            raise ValueError("metric.threshold needs at least one rule")
        if value and not wanted:
            raise ValueError("threshold rules need the metric.threshold event")
        return value


class WebhookIn(Rules):
    url: str = Field(max_length=2000)
    format: Literal["standard", "slack"] = "standard"
    team: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$",
        description="whose runs: a member's own team; an admin's any team, or every team if unset",
    )


class WebhookPatch(BaseModel):
    url: str | None = Field(default=None, max_length=2000)
    format: Literal["standard", "slack"] | None = None
    events: list[EventType] | None = Field(default=None, min_length=1)
    statuses: list[RunStatus] | None = None
    recipe: str | None = Field(default=None, max_length=64, pattern=_PRINTABLE)
    name_pattern: str | None = Field(default=None, max_length=200, pattern=_PRINTABLE)
    thresholds: list[Threshold] | None = Field(default=None, max_length=20)
    paused: bool | None = Field(default=None, description="false resumes a paused subscription")


class Rotate(BaseModel):
    overlap_s: int = Field(default=86400, ge=0, le=7 * 86400)


def shown_url(url: str) -> str:
    """A webhook's URL with its path and query masked: a Slack URL's path is its channel's key."""
    parts = urlsplit(url)
    hidden = parts.path not in ("", "/") or parts.query or parts.fragment
    return f"{parts.scheme}://{parts.netloc}/" + ("…" if hidden else "")


def _out(hook: Webhook, principal: Principal, standing: Standing | None = None) -> WebhookOut:
    """A subscription as ``principal`` may read it: the full URL for its maker and admins,
    the host and a masked path for everyone else."""
    rules = hook.rules
    last = standing.last if standing else None
    maker = principal.at_least("member") and principal.user == hook.created_by
    return WebhookOut(
        id=hook.id,
        team=hook.team,
        url=hook.url if maker or principal.at_least("admin") else shown_url(hook.url),
        format=hook.format,
        events=rules.get("events", []),
        statuses=rules.get("statuses", []),
        recipe=rules.get("recipe"),
        name_pattern=rules.get("name_pattern"),
        thresholds=rules.get("thresholds", []),
        created_by=hook.created_by,
        created_at=hook.created_at,
        paused_at=hook.paused_at,
        paused_reason=hook.paused_reason,
        last_attempt=AttemptOut.model_validate(last, from_attributes=True) if last else None,
        failures=standing.failures if standing else 0,
    )


def new_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


def _checked_url(url: str, allow: Sequence[str]) -> str:
    try:
        return check(url, AllowList.parse(allow)).url
    except UnsafeUrl as exc:
        raise InvalidSpec(str(exc), [field_error(["url"], str(exc))]) from None


def _team_for(principal: Principal, team: str | None) -> str | None:
    if principal.at_least("admin"):
        return team
    if team is not None and team != principal.team:
        raise Forbidden("a member subscribes to its own team's runs only")
    return principal.team


def _visible(session: Session, principal: Principal, hook_id: str, lock: bool = False) -> Webhook:
    hook = session.get(Webhook, hook_id, with_for_update=lock)
    if hook is None or not (principal.at_least("admin") or hook.team == principal.team):
        raise NotFound(f"no webhook {hook_id}")
    return hook


@router.post("/webhooks", status_code=201, response_model=NewWebhook)
def create_webhook(
    services: ServicesDep, principal: Member, request: Request, body: WebhookIn
) -> NewWebhook:
    """Subscribe a URL to run events; the answer carries its signing secret, once."""
    team = _team_for(principal, body.team)
    url = _checked_url(body.url, services.settings.webhook_allow)
    hook = Webhook(
        id=f"whk_{secrets.token_hex(8)}",
        team=team,
        created_by=principal.user,
        url=url,
        rules=Rules.model_validate(body, from_attributes=True).model_dump(mode="json"),
        format=body.format,
        secret=new_secret(),
        created_at=utcnow(),
    )
    with services.db.transaction() as session:
        session.add(hook)
        session.flush()
        audited(session, request, principal, "webhook.create", target=hook.id)
        return NewWebhook(**_out(hook, principal).model_dump(), secret=hook.secret)


@router.get("/webhooks", response_model=list[WebhookOut])
def list_webhooks(services: ServicesDep, principal: Viewer) -> list[WebhookOut]:
    """A team's subscriptions (an admin: every one), without their secrets, each with its
    newest attempt and the failures since its last success."""
    with services.db.read() as session:
        query = select(Webhook).order_by(Webhook.created_at.desc())
        if not principal.at_least("admin"):
            query = query.where(Webhook.team == principal.team)
        hooks = session.scalars(query.limit(500)).all()
        stood = standing(session, [h.id for h in hooks])
        return [_out(h, principal, stood[h.id]) for h in hooks]


@router.get("/webhooks/{hook_id}", response_model=WebhookOut)
def get_webhook(services: ServicesDep, principal: Viewer, hook_id: str) -> WebhookOut:
    with services.db.read() as session:
        hook = _visible(session, principal, hook_id)
        return _out(hook, principal, standing(session, [hook.id])[hook.id])


@router.patch("/webhooks/{hook_id}", response_model=WebhookOut)
def update_webhook(
    services: ServicesDep, principal: Member, request: Request, hook_id: str, body: WebhookPatch
) -> WebhookOut:
    """Change what it hears or where it calls; ``paused: false`` resumes it."""
    changes = body.model_dump(exclude_unset=True, mode="json")
    url = (
        _checked_url(changes["url"], services.settings.webhook_allow) if "url" in changes else None
    )
    with services.db.transaction() as session:
        hook = _visible(session, principal, hook_id, lock=True)
        if url is not None:
            hook.url = url
        if changes.get("format"):
            hook.format = changes["format"]
        hook.rules = _merged_rules(hook.rules, changes)
        # A rule changed or gone starts afresh: where the old one stood on each run goes.
        rules = [rule_id(r) for r in hook.rules["thresholds"]]
        session.execute(
            delete(WebhookThreshold).where(
                WebhookThreshold.webhook_id == hook.id, WebhookThreshold.rule.not_in(rules)
            )
        )
        if changes.get("paused") is False:
            hook.paused_at, hook.paused_reason = None, None
        elif changes.get("paused") is True and hook.paused_at is None:
            hook.paused_at, hook.paused_reason = utcnow(), f"paused by {principal.user}"
        audited(session, request, principal, "webhook.update", target=hook.id)
        session.flush()
        return _out(hook, principal, standing(session, [hook.id])[hook.id])


def _merged_rules(rules: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """The subscription's rules with the fields a PATCH gives (``statuses: null``: all)."""
    given = {k: changes[k] for k in Rules.model_fields if k in changes}
    for name in ("statuses", "thresholds"):
        if name in given and given[name] is None:
            given[name] = []
    try:
        return Rules.model_validate(rules | given).model_dump(mode="json")
    except ValidationError as exc:
        raise invalid_from_pydantic(exc) from None


@router.delete("/webhooks/{hook_id}", status_code=204)
def delete_webhook(
    services: ServicesDep, principal: Member, request: Request, hook_id: str
) -> None:
    """Gone, with its deliveries not yet sent."""
    with services.db.transaction() as session:
        hook = _visible(session, principal, hook_id, lock=True)
        session.delete(hook)
        audited(session, request, principal, "webhook.delete", target=hook_id)


@router.post("/webhooks/{hook_id}/rotate", response_model=NewSecret)
def rotate_secret(
    services: ServicesDep,
    principal: Member,
    request: Request,
    hook_id: str,
    body: Rotate | None = None,
) -> NewSecret:
    """A new signing secret; the old one also signs for ``overlap_s`` (default a day)."""
    overlap = (body or Rotate()).overlap_s
    with services.db.transaction() as session:
        hook = _visible(session, principal, hook_id, lock=True)
        until = utcnow() + timedelta(seconds=overlap) if overlap else None
        hook.previous_secret = hook.secret if overlap else None
        hook.previous_until = until
        hook.secret = new_secret()
        audited(session, request, principal, "webhook.rotate", target=hook.id)
        return NewSecret(secret=hook.secret, previous_valid_until=until)


@router.get("/webhooks/{hook_id}/deliveries", response_model=list[DeliveryOut])
def list_deliveries(
    services: ServicesDep,
    principal: Viewer,
    hook_id: str,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
) -> list[DeliveryOut]:
    """The newest deliveries with every attempt (status code, latency, error)."""
    with services.db.read() as session:
        _visible(session, principal, hook_id)
        rows = session.scalars(
            select(WebhookDelivery)
            .where(WebhookDelivery.webhook_id == hook_id)
            .order_by(WebhookDelivery.created_at.desc(), WebhookDelivery.id)
            .limit(limit)
        ).all()
        attempts: dict[str, list[AttemptOut]] = {r.id: [] for r in rows}
        for a in session.scalars(
            select(WebhookAttempt)
            .where(WebhookAttempt.delivery_id.in_(list(attempts)))
            .order_by(WebhookAttempt.id)
        ):
            attempts[a.delivery_id].append(AttemptOut.model_validate(a, from_attributes=True))
        return [
            DeliveryOut(
                id=r.id,
                event_type=r.event_type,
                run_id=r.run_id,
                state=r.state,
                created_at=r.created_at,
                next_attempt_at=r.next_attempt_at,
                delivered_at=r.delivered_at,
                attempts=attempts[r.id],
            )
            for r in rows
        ]

"""The outbox: a delivery row per matching subscription, written in the transaction of the event
it tells of, so an event is never told without having happened nor lost once it has."""

from __future__ import annotations

import fnmatch
import secrets
from typing import Any, Literal, get_args

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.clock import utcnow
from service.store.models import Run, RunEvent, Webhook, WebhookDelivery
from service.wire.documents import attributes

# What a subscription may ask for.
EventType = Literal[
    "run.status",
    "run.health",
    "run.failed",
    "run.retrying",
    "run.attempt_ended",
    "run.preempted",
    "metric.threshold",
    "run.grant_replayed",
    "run.checkpoint",
    "run.stop_requested",
]
EVENT_TYPES: tuple[str, ...] = get_args(EventType)


def message_id() -> str:
    return f"msg_{secrets.token_hex(12)}"


def wants(hook: Webhook, event_type: str, run: Run) -> bool:
    rules = hook.rules
    if hook.paused_at is not None or event_type not in rules.get("events", []):
        return False
    if hook.team is not None and hook.team != run.team:
        return False
    if event_type == "run.status" and rules.get("statuses") and run.status not in rules["statuses"]:
        return False
    if rules.get("recipe") and rules["recipe"] != run.recipe:
        return False
    pattern = rules.get("name_pattern")
    return not pattern or fnmatch.fnmatchcase(run.name, pattern)


def enqueue(session: Session, run: Run, event: RunEvent, event_type: str, **extra: Any) -> int:
    """A delivery for each subscription that wants ``event_type`` of ``run``; how many."""
    hooks = session.scalars(
        select(Webhook).where(
            Webhook.paused_at.is_(None), (Webhook.team.is_(None)) | (Webhook.team == run.team)
        )
    ).all()
    targets = [h for h in hooks if wants(h, event_type, run)]
    if not targets:
        return 0
    payload = {
        "run": _run(run),
        "event": {
            "id": event.id,
            "at": event.at.isoformat(),
            "from": event.from_status,
            "to": event.to_status,
            "reason": event.reason,
        },
        **extra,
    }
    for hook in targets:
        _add(session, hook, event_type, run, payload)
    return len(targets)


def enqueue_threshold(session: Session, run: Run, hook: Webhook, threshold: dict[str, Any]) -> None:
    """A ``metric.threshold`` delivery to ``hook``: the rule crossed, at which step, what value."""
    _add(session, hook, "metric.threshold", run, {"run": _run(run), "threshold": threshold})


def _run(run: Run) -> dict[str, Any]:
    return attributes(run, ("id", "name", "team", "recipe", "status", "health"))


def _add(
    session: Session, hook: Webhook, event_type: str, run: Run, payload: dict[str, Any]
) -> None:
    now = utcnow()
    session.add(
        WebhookDelivery(
            id=message_id(),
            webhook_id=hook.id,
            event_type=event_type,
            run_id=run.id,
            payload=payload,
            created_at=now,
            next_attempt_at=now,
            state="pending",
            attempts=0,
        )
    )

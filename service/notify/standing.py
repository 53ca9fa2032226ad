"""Where each subscription stands: its newest attempt, and how many attempts have failed since
its last success (what an operator looks at first when a receiver goes quiet)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import and_, func, select
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import ColumnElement

from service.store.models import WebhookAttempt, WebhookDelivery


@dataclass(frozen=True)
class Standing:
    last: WebhookAttempt | None
    failures: int  # attempts since the last 2xx answer (all of them when none succeeded)


def _ok() -> ColumnElement[bool]:
    return and_(WebhookAttempt.status_code >= 200, WebhookAttempt.status_code < 300)


def standing(session: Session, hook_ids: Sequence[str]) -> dict[str, Standing]:
    """Each subscription's standing, in three queries whatever their number."""
    if not hook_ids:
        return {}
    hook = WebhookDelivery.webhook_id
    joined = select(hook, func.max(WebhookAttempt.id).label("upto")).join(
        WebhookDelivery, WebhookDelivery.id == WebhookAttempt.delivery_id
    )
    mine = hook.in_(list(hook_ids))
    newest = dict(session.execute(joined.where(mine).group_by(hook)).tuples().all())
    last_ok = joined.where(mine, _ok()).group_by(hook).subquery()
    failed = session.execute(
        select(hook, func.count())
        .select_from(WebhookAttempt)
        .join(WebhookDelivery, WebhookDelivery.id == WebhookAttempt.delivery_id)
        .outerjoin(last_ok, last_ok.c.webhook_id == hook)
        .where(mine, WebhookAttempt.id > func.coalesce(last_ok.c.upto, 0))
        .group_by(hook)
    ).tuples()
    failures = dict(failed.all())
    attempts = {
        a.id: a
        for a in session.scalars(
            select(WebhookAttempt).where(WebhookAttempt.id.in_(list(newest.values())))
        )
    }
    return {
        h: Standing(attempts.get(newest[h]) if h in newest else None, failures.get(h, 0))
        for h in hook_ids
    }

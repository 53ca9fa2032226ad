"""``metric.threshold``: a subscription's rules on a run's metrics, evaluated as points are stored.

A rule is ``{key, op, value, for_steps}``: it is met at a step when ``value_at_step op value``,
and it fires once ``for_steps`` consecutive logged steps of ``key`` meet it. It fires once per
crossing: having fired it stays quiet until a step no longer meets it (it re-arms), however long
the run stays past the line. Where each (subscription, run, rule) stands is a row written in the
transaction that stores the points, so the delivery it owes is as durable as they are and a
re-read log (steps at or before the row's ``last_step``) changes nothing.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.metrics.parse import MetricLine
from service.notify import outbox
from service.store.models import Run, Webhook, WebhookThreshold
from service.wire.webhooks import ThresholdOp

_COMPARE: dict[ThresholdOp, Callable[[float, float], bool]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


def rule_id(rule: dict[str, Any]) -> str:
    """A rule's identity in its state rows: ``critic/score/mean < 0.1 for 20``."""
    return f"{rule['key']} {rule['op']} {float(rule['value']):g} for {rule['for_steps']}"


def met(rule: dict[str, Any], value: float) -> bool:
    """Whether ``value`` meets the rule (NaN meets none: a NaN is for the health checks)."""
    return not math.isnan(value) and _COMPARE[rule["op"]](value, float(rule["value"]))


def listening(session: Session) -> list[Webhook]:
    """The subscriptions with threshold rules that hear events now (one query per batch)."""
    hooks = session.scalars(select(Webhook).where(Webhook.paused_at.is_(None))).all()
    return [
        h for h in hooks if h.rules.get("thresholds") and "metric.threshold" in h.rules["events"]
    ]


def evaluate(
    session: Session, run: Run, lines: Sequence[MetricLine], hooks: Sequence[Webhook]
) -> int:
    """Walk the new ``lines`` of ``run`` through the rules of ``hooks``; the deliveries written."""
    mine = [h for h in hooks if outbox.wants(h, "metric.threshold", run)]
    keys = {key for line in lines for key in line.values}
    pairs = [(h, r) for h in mine for r in h.rules["thresholds"] if r["key"] in keys]
    if not pairs:
        return 0
    states = {
        (s.webhook_id, s.rule): s
        for s in session.scalars(
            select(WebhookThreshold).where(
                WebhookThreshold.run_id == run.id,
                WebhookThreshold.webhook_id.in_({h.id for h, _ in pairs}),
            )
        )
    }
    fired = 0
    for hook, rule in pairs:
        ident = rule_id(rule)
        state = states.get((hook.id, ident))
        if state is None:
            state = WebhookThreshold(
                webhook_id=hook.id, run_id=run.id, rule=ident, streak=0, last_step=-1, fired=False
            )
            session.add(state)
            states[(hook.id, ident)] = state
        for step, value in _series(lines, rule["key"]):
            if step <= state.last_step:
                continue  # read before: counted already
            state.last_step = step
            if not met(rule, value):
                state.streak, state.fired = 0, False  # cleared: armed again
                continue
            state.streak += 1
            if not state.fired and state.streak >= rule["for_steps"]:
                state.fired = True
                fired += 1
                outbox.enqueue_threshold(
                    session,
                    run,
                    hook,
                    {"key": rule["key"], "value": _json(value), "step": step, "rule": rule},
                )
    return fired


def _series(lines: Sequence[MetricLine], key: str) -> list[tuple[int, float]]:
    """``key``'s (step, value) in step order, the last value of a step logged twice."""
    by_step = {line.step: line.values[key] for line in lines if key in line.values}
    return sorted(by_step.items())


def _json(value: float) -> float | str:
    return value if math.isfinite(value) else str(value)  # JSON has no inf

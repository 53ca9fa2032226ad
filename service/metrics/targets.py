"""A run's target (``stop_when`` in its spec: ``{key, op, value, for_steps}``), checked as its
points are stored: once ``key op value`` holds for ``for_steps`` consecutive logged steps, the
run is asked to stop at its next checkpoint and to end SUCCEEDED, "target reached at step N"
(``lifecycle.request_yield``). The streak is read back from the stored points, so a restart
(or another replica taking the run's log over) counts on where the last commit left it."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.orm import Session

from service.metrics import store
from service.metrics.parse import MetricLine
from service.notify.thresholds import met
from service.store.lifecycle import request_yield
from service.store.models import Run
from service.store.status import ACTIVE, RunStatus


def describe(rule: dict[str, object]) -> str:
    return f"{rule['key']} {rule['op']} {rule['value']:g} for {rule['for_steps']} steps"


def check(session: Session, run: Run, lines: Sequence[MetricLine], within_s: float) -> bool:
    """Ask ``run`` to stop at its next checkpoint (within ``within_s``) if its new ``lines``
    reach its target; returns whether they did now."""
    rule = (run.spec or {}).get("stop_when")
    if not isinstance(rule, dict) or run.status not in ACTIVE:
        return False
    if run.stop_requested_at is not None or run.yield_then == RunStatus.SUCCEEDED:
        return False
    key, n = rule["key"], int(rule.get("for_steps", 1))
    new = {line.step for line in lines if key in line.values}
    if not new:
        return False
    # The new steps and the ``n`` before them: the first new step that ends a streak of ``n``
    # is where the target was reached (a log read late holds many steps at once).
    history = store.recent(session, run.id, key, n + len(new))
    # Steps of this attempt only: a retried run's target is reached again by this attempt.
    since = run.resumed_from_step or 0
    streak, reached = 0, None
    for step, value in history:
        streak = streak + 1 if step > since and met(rule, value) else 0
        if streak >= n and step in new:
            reached = step
            break
    if reached is None:
        return False
    reason = f"target reached at step {reached} ({describe(rule)})"
    return request_yield(
        session, run, within_s, reason, then=RunStatus.SUCCEEDED, after_step=reached - 1
    )

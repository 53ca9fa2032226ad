"""Health read from a run's metrics: NaN in a loss, a weight sync the rollout did not take
(``weight_sync``), reward collapse, no new step (stalled), and
verl's fully async signals (``rl_signals``: staleness drift, a growing sync, idle imbalance).

The follower calls ``evaluate`` for every run it holds; the result goes through ``set_health``.
A health set by another check (e.g. ``stuck``) is left alone (see ``store.status``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy.orm import Session

from service.metrics import rl_signals, store, weight_sync
from service.metrics.keys import REWARD_KEY
from service.metrics.parse import MetricLine
from service.store.lifecycle import set_health
from service.store.models import Run, RunLog
from service.store.status import METRIC_HEALTH, RL_HEALTH, Health, RunStatus


@dataclass(frozen=True)
class HealthRules:
    stall_after_s: float = 600.0
    # Collapse: the last ``patience`` rewards all below (1 - drop) x the best before them.
    collapse_window: int = 20
    collapse_patience: int = 3
    collapse_drop: float = 0.5
    collapse_min_best: float = 0.1
    signals: rl_signals.SignalRules = field(default_factory=rl_signals.SignalRules)


def _nan_loss(lines: Sequence[MetricLine]) -> tuple[str | None, bool]:
    """(reason if the newest value of some loss is NaN, whether any loss was logged)."""
    newest: dict[str, tuple[int, float]] = {}
    for line in lines:
        for key, value in line.values.items():
            if "loss" in key:
                newest[key] = (line.step, value)
    for key, (step, value) in sorted(newest.items()):
        if math.isnan(value):
            return f"{key} is NaN at step {step}", True
    return None, bool(newest)


def _collapse(session: Session, run: Run, rules: HealthRules) -> str | None:
    """Why the reward collapsed, if it did: its last ``patience`` values all below (1 - drop) x
    its best of the window before them. A collapsed run stays so until the reward is back above
    that bar of its best of the whole run (a window of collapsed rewards alone has no best)."""
    history = store.recent(session, run.id, REWARD_KEY, rules.collapse_window)
    if len(history) <= rules.collapse_patience:
        return None
    before, last = history[: -rules.collapse_patience], history[-rules.collapse_patience :]
    # (value, -step): the max is the best and, of equal ones, the first.
    finite = [(v, -s) for s, v in before if math.isfinite(v)]
    if run.health == "reward_collapse" and (highest := store.highest(session, run.id, REWARD_KEY)):
        finite.append((highest[1], -highest[0]))
    if not finite:
        return None
    best, best_step = max(finite)
    bar = best * (1 - rules.collapse_drop)
    if best < rules.collapse_min_best or not all(v < bar for _, v in last):
        return None
    if run.health == "reward_collapse" and run.health_reason:
        return run.health_reason  # the verdict as first given: one event for one collapse
    # A reward of 0 is every response scoring 0: a group-relative advantage (GRPO's) is then 0
    # for every group, and nothing is left to learn back from.
    none = "; every response scored 0" if last[-1][1] == 0 else ""
    return (
        f"{REWARD_KEY} fell from its best {best:.3g} (step {-best_step}) to "
        f"{last[-1][1]:.3g} for {rules.collapse_patience} steps{none}"
    )


def evaluate(
    session: Session,
    run: Run,
    runlog: RunLog,
    lines: Sequence[MetricLine],
    now: datetime,
    rules: HealthRules,
) -> None:
    if run.health not in METRIC_HEALTH:
        return
    health: Health = "ok"
    reason: str | None = None
    nan_reason, loss_logged = _nan_loss(lines)
    # The reward's history changes only with new rewards: without one the verdict stands.
    rewarded = any(REWARD_KEY in line.values for line in lines)
    collapse = _collapse(session, run, rules) if rewarded else None
    since = runlog.last_step_at or run.started_at
    unsynced = weight_sync.problem(run)
    if nan_reason:
        health, reason = "nan", nan_reason
    elif run.health == "nan" and not loss_logged:
        health, reason = "nan", run.health_reason
    elif unsynced:
        health, reason = "weights_unsynced", unsynced
    elif collapse:
        health, reason = "reward_collapse", collapse
    elif run.health == "reward_collapse" and not rewarded:
        health, reason = "reward_collapse", run.health_reason
    elif (
        run.status == RunStatus.RUNNING
        and since is not None
        and (now - since).total_seconds() > rules.stall_after_s
    ):
        health = "stalled"
        reason = f"no new step for {int((now - since).total_seconds())} s" + (
            f" (last step {runlog.last_step})" if runlog.last_step is not None else ""
        )
        if run.health == "stalled":
            reason = run.health_reason
    elif signal := rl_signals.check(session, run, lines, rules.signals):
        health, reason = signal
    elif run.health in RL_HEALTH and not rl_signals.logged(lines):
        health, reason = run.health, run.health_reason
    set_health(session, run, health, reason)

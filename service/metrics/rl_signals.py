"""Health from verl's fully async metrics: a run that learns but wastes its accelerators.

- ``idle_imbalance``: the trainer's and the rollouter's ``idle_ratio`` apart by at least
  ``idle_gap`` on average over the window. The hint moves accelerators toward the busier group:
  with ``n`` accelerators and busy share ``b = 1 - idle`` per group, the trainer's fair count is
  ``N * n_t b_t / (n_t b_t + n_r b_r)``, and ``k`` is how far the run is from it.
- ``sync_growing``: the weight sync (``timing_s/timing_s/param_sync``, verl #4896) of the
  newest half-window takes ``growth`` times what it took over the run's first window (medians:
  one slow sync is no trend).
- ``staleness_drift``: stale trajectories consumed per step (the rise of the cumulative
  ``stale_trajectory_processed``) grow likewise: the rollouter drifts ahead of the weights.

Each reads the window's history only when the new lines carry its keys.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlalchemy.orm import Session

from service.metrics import store
from service.metrics.keys import PARAM_SYNC_KEY, ROLLOUTER_IDLE_KEY, STALE_KEY, TRAINER_IDLE_KEY
from service.metrics.parse import MetricLine
from service.store.models import Run
from service.store.status import Health

KEYS = frozenset({TRAINER_IDLE_KEY, ROLLOUTER_IDLE_KEY, PARAM_SYNC_KEY, STALE_KEY})


@dataclass(frozen=True)
class SignalRules:
    window: int = 10
    idle_gap: float = 0.3
    growth: float = 1.5


def _finite(history: list[tuple[int, float]]) -> list[float]:
    return [v for _, v in history if math.isfinite(v)]


def _grown(
    early: list[tuple[int, float]], late: list[tuple[int, float]], rules: SignalRules
) -> tuple[float, float] | None:
    """(early, late) medians when ``late`` (after all of ``early``) grew ``growth`` times."""
    if len(early) < rules.window or len(late) < rules.window // 2 or late[0][0] <= early[-1][0]:
        return None
    early_v, late_v = _finite(early), _finite(late)
    if not early_v or not late_v:
        return None
    before, now = statistics.median(early_v), statistics.median(late_v)
    return (before, now) if before > 0 and now >= rules.growth * before else None


def _growth_note(
    early: list[tuple[int, float]],
    late: list[tuple[int, float]],
    rules: SignalRules,
    what: str,
    unit: str,
    why: str,
) -> str | None:
    """How ``what`` grew from ``early`` to ``late`` and ``why`` it matters; None if it did not."""
    if (grown := _grown(early, late, rules)) is None:
        return None
    before, now = grown
    return (
        f"{what} grew {now / before:.1f}x: {now:.3g}{unit} over the last {rules.window // 2} "
        f"steps, {before:.3g}{unit} over the first {rules.window}; {why}"
    )


def _rises(counts: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """A cumulative count's rise per step (a fall, where an attempt restarted it, skipped)."""
    return [(s, b - a) for (_, a), (s, b) in itertools.pairwise(counts) if b >= a]


def pools(run: Run) -> tuple[int, int]:
    """Accelerators of the run's trainer and rollout groups (0 when its shape names none)."""
    groups = (run.launch or {}).get("shape", {}).get("groups", [])

    def held(role: str) -> int:
        return sum(int(g["accelerators"]) for g in groups if g["role"] == role)

    return held("trainer"), held("rollout")


def move(trainer: int, rollout: int, trainer_idle: float, rollout_idle: float) -> int:
    """Accelerators to move from rollout to trainer (negative: the other way) to even the load."""
    work_t, work_r = trainer * (1 - trainer_idle), rollout * (1 - rollout_idle)
    if work_t + work_r <= 0:
        return 0
    fair = (trainer + rollout) * work_t / (work_t + work_r)
    return round(fair - trainer)


def idle_imbalance(session: Session, run: Run, rules: SignalRules) -> str | None:
    t = _finite(store.recent(session, run.id, TRAINER_IDLE_KEY, rules.window))
    r = _finite(store.recent(session, run.id, ROLLOUTER_IDLE_KEY, rules.window))
    if len(t) < rules.window or len(r) < rules.window:
        return None
    t_idle, r_idle = sum(t) / len(t), sum(r) / len(r)
    if abs(t_idle - r_idle) < rules.idle_gap:
        return None
    trainer, rollout = pools(run)
    k = move(trainer, rollout, t_idle, r_idle) if trainer and rollout else 0
    src, dst = ("rollout", "trainer") if r_idle > t_idle else ("trainer", "rollout")
    if trainer and rollout and k == 0:
        return None  # as even as whole accelerators make it
    how = f"about {abs(k)} accelerators" if k else "accelerators"
    return (
        f"idle ratio trainer {t_idle:.2f} vs rollouter {r_idle:.2f} over {rules.window} steps: "
        f"move {how} from {src} to {dst} (now {trainer} trainer, {rollout} rollout)"
    )


def sync_growing(session: Session, run: Run, rules: SignalRules) -> str | None:
    early = store.first(session, run.id, PARAM_SYNC_KEY, rules.window)
    late = store.recent(session, run.id, PARAM_SYNC_KEY, rules.window // 2)
    return _growth_note(
        early, late, rules, PARAM_SYNC_KEY, " s", "each weight sync holds up both groups longer"
    )


def staleness_drift(session: Session, run: Run, rules: SignalRules) -> str | None:
    early = _rises(store.first(session, run.id, STALE_KEY, rules.window + 1))
    late = _rises(store.recent(session, run.id, STALE_KEY, rules.window // 2 + 1))
    why = (
        "the rollouter drifts ahead of the trainer's weights "
        "(async_training.staleness_threshold bounds it)"
    )
    return _growth_note(early, late, rules, "stale trajectories per step", "", why)


# Most telling first: stale samples change what is learnt; a slow sync and idle groups cost time.
_CHECKS: tuple[tuple[Health, Callable[[Session, Run, SignalRules], str | None]], ...] = (
    ("staleness_drift", staleness_drift),
    ("sync_growing", sync_growing),
    ("idle_imbalance", idle_imbalance),
)


def check(
    session: Session, run: Run, lines: Sequence[MetricLine], rules: SignalRules
) -> tuple[Health, str] | None:
    """The first signal that holds, read only if the new lines carry any of their keys."""
    if not logged(lines):
        return None
    for name, signal in _CHECKS:
        reason = signal(session, run, rules)
        if reason is not None:
            return name, reason
    return None


def logged(lines: Sequence[MetricLine]) -> bool:
    return any(KEYS & line.values.keys() for line in lines)

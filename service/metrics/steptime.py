"""Where a step's time goes in a verl fully async run, and which group holds the run back:
pure functions over metric series (``{key: [(step, value), ...]}``), no I/O.

verl's trainer times each step (``timing_s/step``, from its wait for samples to its weight sync,
the checkpoint after it excluded): ``timing_s/gen`` is the trainer **waiting** for the
rollouts' samples (``_get_samples_from_queue``), ``timing_s/update_actor`` its update,
``timing_s/timing_s/param_sync`` (V1: ``timing_s/update_weights``) the weight sync; the rest
(log probs, advantages, reward) is ``other``. From these, not from verl's idle ratios:

- verl's two ``idle_ratio`` can both read near 0 while the run is slower than a synchronous one
  (verl #6693), and the V1 trainer logs none (#7601): the trainer's idle share is its wait for
  samples over its step time, the rollouts' is ``1 - active_time / version_time`` where verl
  logs them (its own ``idle_ratio`` otherwise), unknown in V1 (said so).
- the weight sync can grow to minutes late in a run (#4896): its trend (first and last
  medians, growth, slope per step) is a health signal of its own, whatever the verdict.

The verdict over the newest ``window`` steps (the first training step, which waits for the
first rollouts, left out when there are others): **sync-bound** when the sync takes
``sync_bound`` of the step; **rollout-bound** when the trainer waits ``wait_bound`` of it;
**trainer-bound** when the trainer hardly waits (< ``low``) and the rollouts idle
``idle_bound`` of their time; **balanced** otherwise. A device split that would even the load
(``move``) is for rollout- and trainer-bound runs only.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from service.metrics.keys import (
    GEN_KEY,
    PARAM_SYNC_KEY,
    ROLLOUTER_ACTIVE_KEY,
    ROLLOUTER_IDLE_KEY,
    ROLLOUTER_VERSION_KEY,
    STEP_TIME_KEY,
    TRAINER_IDLE_KEY,
    UPDATE_ACTOR_KEY,
    V1_SWITCH_IDLE_KEY,
    V1_SYNC_KEY,
)

Series = Mapping[str, Sequence[tuple[int, float]]]
Verdict = Literal["rollout-bound", "trainer-bound", "sync-bound", "balanced", "unknown"]

# Every key the analysis reads.
KEYS = (
    STEP_TIME_KEY,
    GEN_KEY,
    UPDATE_ACTOR_KEY,
    PARAM_SYNC_KEY,
    V1_SYNC_KEY,
    TRAINER_IDLE_KEY,
    ROLLOUTER_IDLE_KEY,
    ROLLOUTER_ACTIVE_KEY,
    ROLLOUTER_VERSION_KEY,
    V1_SWITCH_IDLE_KEY,
)


@dataclass(frozen=True)
class Rules:
    window: int = 20  # newest steps the verdict reads
    sync_bound: float = 0.25  # share of the step in the weight sync
    wait_bound: float = 0.3  # share of the step the trainer waits for samples
    idle_bound: float = 0.3  # share of their time the rollouts idle
    low: float = 0.1  # a share this small is "hardly"
    near_zero: float = 0.05  # verl's idle ratios read as "both near 0" below this
    growth: float = 1.5  # the sync's last median this many times its first: growing
    trend_points: int = 6  # syncs needed before a trend is told


@dataclass(frozen=True)
class StepTime:
    """One step's seconds: the whole and its parts (``other`` is what the parts leave)."""

    step: int
    total: float
    wait: float  # timing_s/gen: waiting for the rollouts' samples
    update: float
    sync: float
    other: float


@dataclass(frozen=True)
class SyncTrend:
    points: int
    first: float  # median of the first third, seconds
    last: float  # median of the last third
    growth: float  # last / first
    slope: float  # least-squares seconds per step
    growing: bool


@dataclass(frozen=True)
class Analysis:
    steps: list[StepTime]
    verdict: Verdict
    summary: str
    # The figures behind the verdict (medians over the window): shares of the step and idle
    # shares, None where the run logs nothing to read them from.
    figures: dict[str, float | None]
    trainer: Literal["v1", "fully_async", "unknown"]
    sync: SyncTrend | None
    notes: list[str] = field(default_factory=list)
    # Accelerators to move toward the group that holds the run back (+: to the rollouts).
    to_rollout: int = 0
    # Where a figure was read from, where there is a choice.
    sources: dict[str, str] = field(default_factory=dict)


def _by_step(points: Sequence[tuple[int, float]]) -> dict[int, float]:
    return {s: v for s, v in points if math.isfinite(v)}


def breakdown(series: Series) -> tuple[list[StepTime], Literal["v1", "fully_async", "unknown"]]:
    """Each step that verl timed, split into wait, update, sync and the rest."""
    total = _by_step(series.get(STEP_TIME_KEY, ()))
    wait = _by_step(series.get(GEN_KEY, ()))
    update = _by_step(series.get(UPDATE_ACTOR_KEY, ()))
    fa_sync = _by_step(series.get(PARAM_SYNC_KEY, ()))
    v1_sync = _by_step(series.get(V1_SYNC_KEY, ()))
    trainer: Literal["v1", "fully_async", "unknown"] = (
        "fully_async" if fa_sync else "v1" if v1_sync else "unknown"
    )
    sync = fa_sync or v1_sync
    out = []
    for step in sorted(total):
        t = total[step]
        w, u, s = wait.get(step, 0.0), update.get(step, 0.0), sync.get(step, 0.0)
        out.append(StepTime(step, t, w, u, s, max(0.0, t - w - u - s)))
    return out, trainer


def sync_trend(points: Sequence[tuple[int, float]], rules: Rules = Rules()) -> SyncTrend | None:
    """How the weight sync's time moves over the run (verl #4896): None with too few syncs."""
    pts = sorted((s, v) for s, v in points if math.isfinite(v))
    if len(pts) < rules.trend_points:
        return None
    third = max(1, len(pts) // 3)
    first = statistics.median(v for _, v in pts[:third])
    last = statistics.median(v for _, v in pts[-third:])
    xs, ys = [float(s) for s, _ in pts], [v for _, v in pts]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0
    growth = last / first if first > 0 else (math.inf if last > 0 else 1.0)
    return SyncTrend(len(pts), first, last, growth, slope, growth >= rules.growth and slope > 0)


def _median(values: Sequence[float]) -> float | None:
    finite = [v for v in values if math.isfinite(v)]
    return statistics.median(finite) if finite else None


def _window(points: Sequence[tuple[int, float]], steps: set[int]) -> list[float]:
    return [v for s, v in points if s in steps]


def rollout_idle(series: Series, steps: set[int]) -> tuple[float | None, str]:
    """The rollouts' idle share over ``steps`` and where it was read from."""
    active = _by_step(series.get(ROLLOUTER_ACTIVE_KEY, ()))
    version = _by_step(series.get(ROLLOUTER_VERSION_KEY, ()))
    derived = [
        1.0 - active[s] / version[s]
        for s in sorted(steps & active.keys() & version.keys())
        if version[s] > 0
    ]
    if derived:
        return _median([min(1.0, max(0.0, d)) for d in derived]), "active_time/version_time"
    logged = _median(_window(series.get(ROLLOUTER_IDLE_KEY, ()), steps))
    return logged, ROLLOUTER_IDLE_KEY if logged is not None else "not logged"


def move(trainer: int, rollout: int, trainer_busy: float, rollout_busy: float) -> int:
    """Accelerators to move to the rollouts (negative: to the trainer) so that each group's
    busy work per accelerator evens out, each group keeping one at least."""
    work_t, work_r = trainer * trainer_busy, rollout * rollout_busy
    if trainer < 1 or rollout < 1 or work_t + work_r <= 0:
        return 0
    fair_t = (trainer + rollout) * work_t / (work_t + work_r)
    fair_t = min(trainer + rollout - 1, max(1, round(fair_t)))
    return trainer - int(fair_t)


def analyse(series: Series, pools: tuple[int, int] = (0, 0), rules: Rules = Rules()) -> Analysis:
    """The breakdown, the verdict with its figures, the sync's trend and the device move for a
    run whose trainer and rollout groups hold ``pools`` accelerators (0, 0: not known)."""
    steps, trainer = breakdown(series)
    notes: list[str] = []
    sync_points = series.get(PARAM_SYNC_KEY) or series.get(V1_SYNC_KEY) or ()
    trend = sync_trend(sync_points, rules)
    if not steps:
        return Analysis([], "unknown", "verl has logged no timed step yet", {}, trainer, trend)
    window = steps[-rules.window :]
    if len(steps) > 1 and window[0] is steps[0]:
        window = window[1:]  # the first step waits for the first rollouts: start-up, not pace
    if len(steps) == 1:
        notes.append("one timed step only, the first: it includes the wait for the first rollouts")
    in_window = {s.step for s in window}
    timed = [s for s in window if s.total > 0]

    def share(part: str) -> float | None:
        return _median([getattr(s, part) / s.total for s in timed])

    wait, sync, update, other = share("wait"), share("sync"), share("update"), share("other")
    r_idle, r_source = rollout_idle(series, in_window)
    verl_t = _median(_window(series.get(TRAINER_IDLE_KEY, ()), in_window))
    verl_r = _median(_window(series.get(ROLLOUTER_IDLE_KEY, ()), in_window))
    step_s = _median([s.total for s in window])
    figures: dict[str, float | None] = {
        "steps": float(len(window)),
        "step_seconds": step_s,
        "wait_share": wait,
        "update_share": update,
        "sync_share": sync,
        "other_share": other,
        "trainer_idle": wait,  # derived: waiting for samples over the step
        "rollout_idle": r_idle,
        "verl_trainer_idle_ratio": verl_t,
        "verl_rollouter_idle_ratio": verl_r,
    }
    if trainer == "v1":
        notes.append(
            "the V1 trainer logs no idle ratio (verl #7601): the trainer's idle share is derived "
            "from timing_s/gen over timing_s/step"
            + ("" if r_idle is not None else "; the rollouts' idle share is not logged")
        )
    if verl_t is not None and verl_r is not None and max(verl_t, verl_r) < rules.near_zero:
        notes.append(
            f"verl's idle ratios both read near 0 (trainer {verl_t:.3f}, rollouter {verl_r:.3f}; "
            "verl #6693): the verdict reads the step's timers instead"
        )
    if trend is not None and trend.growing:
        notes.append(
            f"the weight sync grows: {trend.first:.3g} s at first, {trend.last:.3g} s now "
            f"({trend.growth:.1f}x, {trend.slope:+.3g} s per step; verl #4896)"
        )
    w, s_ = wait or 0.0, sync or 0.0
    verdict: Verdict
    if s_ >= rules.sync_bound and s_ >= w:
        verdict = "sync-bound"
        summary = (
            f"the weight sync takes {s_:.0%} of a step ({step_s:.3g} s median): fewer syncs "
            "(a larger async_training.trigger_parameter_sync_step) or a faster transport help "
            "more than another device split"
        )
    elif w >= rules.wait_bound:
        verdict = "rollout-bound"
        summary = (
            f"the trainer waits for samples {w:.0%} of each step ({step_s:.3g} s median): the "
            "rollouts cannot keep up"
        )
    elif w < rules.low and r_idle is not None and r_idle >= rules.idle_bound:
        verdict = "trainer-bound"
        summary = (
            f"the rollouts idle {r_idle:.0%} of their time while the trainer waits only "
            f"{w:.0%} of its step: the trainer cannot keep up"
        )
    else:
        verdict = "balanced"
        idle = "not logged" if r_idle is None else f"{r_idle:.0%}"
        summary = (
            f"the trainer waits {w:.0%} of its step, the rollouts idle {idle}, the sync takes "
            f"{s_:.0%}: neither group holds the other back"
        )
    to_rollout = 0
    trainer_n, rollout_n = pools
    if verdict in ("rollout-bound", "trainer-bound") and trainer_n and rollout_n:
        busy_r = 1.0 - (r_idle if r_idle is not None else 0.0)
        to_rollout = move(trainer_n, rollout_n, 1.0 - w, busy_r)
        if to_rollout == 0:
            notes.append(
                f"no split of {trainer_n + rollout_n} accelerators evens it out ({trainer_n} "
                f"trainer, {rollout_n} rollout; each group keeps one at least)"
            )
    sources = {"trainer_idle": f"{GEN_KEY} / {STEP_TIME_KEY}", "rollout_idle": r_source}
    return Analysis(steps, verdict, summary, figures, trainer, trend, notes, to_rollout, sources)


def as_doc(analysis: Analysis) -> dict[str, Any]:
    """The analysis as the API answers it (``wire.metrics.StepTimeOut`` less run and change)."""
    trend = analysis.sync
    return {
        "trainer": analysis.trainer,
        "verdict": analysis.verdict,
        "summary": analysis.summary,
        "figures": analysis.figures,
        "notes": analysis.notes,
        "sources": analysis.sources,
        "sync_trend": None
        if trend is None
        else {
            "points": trend.points,
            "first_seconds": trend.first,
            "last_seconds": trend.last,
            "growth": trend.growth if math.isfinite(trend.growth) else None,
            "slope_seconds_per_step": trend.slope,
            "growing": trend.growing,
        },
        "to_rollout": analysis.to_rollout,
        "steps": [
            {
                "step": s.step,
                "total": s.total,
                "wait": s.wait,
                "update": s.update,
                "sync": s.sync,
                "other": s.other,
            }
            for s in analysis.steps
        ],
    }

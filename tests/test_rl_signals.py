"""Health from verl's fully async metrics: synthetic series that should and should not raise
staleness drift, a growing weight sync and idle imbalance (with how many accelerators to move),
through the follower as verl's lines arrive; each delivered as ``run.health``."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from sqlalchemy import select

from service.loops.follower import Follower
from service.metrics import rl_signals
from service.metrics.health import HealthRules
from service.metrics.keys import PARAM_SYNC_KEY, ROLLOUTER_IDLE_KEY, STALE_KEY, TRAINER_IDLE_KEY
from service.metrics.log_readers import WholeLogReader
from service.recipes.base import Launch
from service.scheduling.shape import Group, ResourceShape
from service.store.db import Database
from service.store.models import RunEvent, WebhookDelivery
from service.store.status import RunStatus
from tests.factories import add_run, add_webhook, read_run
from tests.fake_ray import FakeRay

WINDOW = 10
Series = Callable[[int], dict[str, float]]


def _pools(trainer: int, rollout: int) -> dict[str, object]:
    groups = (Group("trainer", 8, 8.0),) * (trainer // 8) + (Group("rollout", 8, 8.0),) * (
        rollout // 8
    )
    return Launch(argv=["true"], runtime_env={}, shape=ResourceShape(groups=groups)).as_dict()


def _health(db: Database, series: Series, steps: int = 2 * WINDOW, **pools: int) -> str:
    """The run's health after ``steps`` lines of ``series``, read in two ticks."""
    launch = _pools(pools.get("trainer", 16), pools.get("rollout", 16))
    run_id, ray = add_run(db, "r1", RunStatus.RUNNING, launch=launch), FakeRay()
    follower = Follower(db, ray, "one", 30, 10_000, HealthRules(), reader=WholeLogReader(ray))
    lines = [
        f"step:{n} - " + " - ".join(f"{k}:{v}" for k, v in series(n).items()) + "\n"
        for n in range(steps)
    ]
    ray.log[run_id] = "".join(lines[: steps // 2])
    follower.tick()
    ray.log[run_id] += "".join(lines[steps // 2 :])
    follower.tick()
    run, _ = read_run(db, run_id)
    return f"{run.health}: {run.health_reason}"


def _idle(trainer: float, rollout: float) -> Series:
    return lambda n: {TRAINER_IDLE_KEY: trainer, ROLLOUTER_IDLE_KEY: rollout}


def test_idle_imbalance_names_how_many_accelerators_to_move_and_which_way(db: Database) -> None:
    # 16 + 16: the trainer is busy, the rollouter idle half the time: 32 x 0.95x16/(0.95x16 +
    # 0.5x16) = 20.97, so about 5 from rollout to trainer.
    said = _health(db, _idle(0.05, 0.5))
    assert said.startswith("idle_imbalance: ")
    assert "move about 5 accelerators from rollout to trainer" in said
    assert "(now 16 trainer, 16 rollout)" in said


def test_an_idle_trainer_moves_accelerators_the_other_way(db: Database) -> None:
    said = _health(db, _idle(0.6, 0.02), trainer=16, rollout=16)
    assert said.startswith("idle_imbalance: ") and "from trainer to rollout" in said


@pytest.mark.parametrize(
    "series",
    [
        _idle(0.1, 0.12),  # verl's own sample: balanced
        _idle(0.05, 0.3),  # apart, but less than the gap
        # apart only for the last few steps of the window: not on average
        lambda n: {TRAINER_IDLE_KEY: 0.05, ROLLOUTER_IDLE_KEY: 0.9 if n >= 18 else 0.05},
    ],
)
def test_balanced_or_briefly_apart_idle_ratios_are_no_imbalance(
    db: Database, series: Series
) -> None:
    assert _health(db, series) == "ok: None"


def test_a_weight_sync_that_keeps_growing_is_sync_growing(db: Database) -> None:
    said = _health(db, lambda n: {PARAM_SYNC_KEY: 7.0 + 0.6 * n})
    assert said.startswith("sync_growing: ") and PARAM_SYNC_KEY in said


@pytest.mark.parametrize(
    "series",
    [
        lambda n: {PARAM_SYNC_KEY: 7.0 + (0.4 if n % 2 else 0.0)},  # noisy, flat
        lambda n: {PARAM_SYNC_KEY: 7.0 + 0.05 * n},  # creeping, within the growth allowed
        lambda n: {PARAM_SYNC_KEY: 30.0 if n == 19 else 7.0},  # one slow sync
    ],
)
def test_a_steady_or_noisy_weight_sync_is_not_growing(db: Database, series: Series) -> None:
    assert _health(db, series) == "ok: None"


def test_stale_trajectories_per_step_that_grow_are_staleness_drift(db: Database) -> None:
    # The count is cumulative: per step 100, then rising by 30 a step.
    def series(n: int) -> dict[str, float]:
        return {STALE_KEY: sum(100 + 30 * i for i in range(n))}

    said = _health(db, series)
    assert said.startswith("staleness_drift: ") and "stale trajectories per step" in said


@pytest.mark.parametrize(
    "series",
    [
        lambda n: {STALE_KEY: 100.0 * n},  # verl's sample: 100 a step, steadily
        lambda n: {STALE_KEY: 100.0 * (n % 12)},  # a resumed attempt counts from 0 again
    ],
)
def test_a_steady_stale_count_is_no_drift(db: Database, series: Series) -> None:
    assert _health(db, series) == "ok: None"


def test_a_signal_clears_when_its_series_recovers_and_each_change_is_an_event(
    db: Database,
) -> None:
    add_webhook(db, ["run.health"], url="http://127.0.0.1:9/x", secret="whsec_x")
    run_id, ray = add_run(db, "r1", RunStatus.RUNNING, launch=_pools(16, 16)), FakeRay()
    follower = Follower(db, ray, "one", 30, 10_000, HealthRules(), reader=WholeLogReader(ray))
    ray.log[run_id] = "".join(
        f"step:{n} - {TRAINER_IDLE_KEY}:0.05 - {ROLLOUTER_IDLE_KEY}:0.6\n" for n in range(WINDOW)
    )
    follower.tick()
    assert read_run(db, run_id)[0].health == "idle_imbalance"
    follower.tick()  # nothing new: the verdict stands, no second event
    ray.log[run_id] += "".join(
        f"step:{n} - {TRAINER_IDLE_KEY}:0.1 - {ROLLOUTER_IDLE_KEY}:0.1\n"
        for n in range(WINDOW, 3 * WINDOW)
    )
    follower.tick()
    run, reasons = read_run(db, run_id)
    assert run.health == "ok"
    assert [r.split(":")[0] for r in reasons if r.startswith("health")] == [
        "health idle_imbalance",
        "health ok",
    ]
    with db.read() as s:
        told = s.scalars(select(RunEvent.reason).where(RunEvent.run_id == run_id)).all()
        assert len(told) == len(reasons)
        kinds = s.scalars(select(WebhookDelivery.event_type)).all()
    assert kinds == ["run.health", "run.health"]


def test_the_move_evens_busy_accelerators_between_the_pools() -> None:
    assert rl_signals.move(16, 16, 0.05, 0.5) == 5
    assert rl_signals.move(16, 16, 0.5, 0.05) == -5
    assert rl_signals.move(16, 16, 0.1, 0.1) == 0
    assert rl_signals.move(8, 24, 0.0, 0.0) == 0

"""verl learns under rlrun: the session's real run (``tests/verl_run.py``, preset ``cpu-learn``:
the seed's recipe in miniature, its warm start on the answer format alone) raises its reward by
the bounds of ``tests/benchmarks/bench_learning.py``, every weight sync proven by a digest on
both sides, verl's rollout-correction figures among its metrics, and the run compared with the
curve pinned from one such run.

Slow, and it needs the trainer stack (rlrun[verl-cpu], README): without it these fail, never
skip.
"""

from __future__ import annotations

from typing import Any

import pytest

from service.recipes.verl.preset import LEARN_SYNCS
from tests.benchmarks.bench_learning import FLOOR, RISE, WINDOW, baseline, curve, learned, rise
from tests.browser import chart_eval, needs_chromium, shot, until
from tests.verl_run import VerlRun

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.timeout(2400)]

# verl's rollout correction as the preset asks for it (decoupled: computed once per batch).
CORRECTION = {"rollout_corr/rollout_is_mean", "rollout_corr/rollout_rs_masked_fraction"}


def test_the_reward_rises_by_the_bounds_under_grpo(verl_run: VerlRun) -> None:
    rewards = [v for _, v in curve(verl_run.http, verl_run.run_id)]
    first, last = rise(rewards)
    print(f"\nreward: first {WINDOW} {first:.3f}, last {WINDOW} {last:.3f}; {rewards}")
    assert len(rewards) >= LEARN_SYNCS - 2, rewards
    assert learned(rewards), f"not last >= first + {RISE} and >= {FLOOR}: {first:.3f} -> {last:.3f}"
    # Against the curve pinned from one such run: no worse than it by more than its own rise.
    pinned = baseline()["rewards"]
    assert last >= rise(pinned)[1] - RISE, (last, rise(pinned))


def test_every_weight_sync_is_proven_by_the_digests_of_both_sides(verl_run: VerlRun) -> None:
    run = verl_run.run
    sync = run["weight_sync"]
    assert run["health"]["status"] == "ok", run["health"]
    assert sync["problem"] is None and sync["waiting"] == [], sync
    assert sync["proven"] == LEARN_SYNCS + 1 and sync["last_version"] == LEARN_SYNCS, sync
    log = verl_run.http.get(f"/runs/{verl_run.run_id}/logs", params={"tail": 100_000}).text
    assert f'"digest": "{sync["last_digest"]}"' in log


def test_verls_rollout_correction_figures_are_among_the_metrics(verl_run: VerlRun) -> None:
    keys = set(verl_run.http.get(f"/runs/{verl_run.run_id}/metrics/keys").json())
    assert keys >= CORRECTION, CORRECTION - keys


@needs_chromium
def test_the_run_page_draws_the_rising_reward_and_pins_it_as_the_baseline(
    verl_run: VerlRun, page: Any
) -> None:
    rewards = [v for _, v in curve(verl_run.http, verl_run.run_id)]
    page.goto(f"{verl_run.service.url}/ui/#/runs/{verl_run.run_id}")
    until(page, "document.querySelector(\"[data-chart='reward']\")?.chart?.plot")
    until(page, f"document.querySelector(\"[data-chart='reward']\").chart.plot.data[0].length"
                f" >= {len(rewards)}")  # fmt: skip
    # The mean drawn is the series the API gives: its last syncs as high as the run reached.
    drawn = chart_eval(page, "reward", "[...c.plot.data[1]]")
    tail = [v for v in drawn if v is not None][-WINDOW:]
    assert abs(sum(tail) / len(tail) - rise(rewards)[1]) < 1e-6, (tail, rewards[-WINDOW:])
    page.click("#pin-baseline")
    until(page, "document.querySelector('#pin-baseline').textContent === 'unpin baseline'")
    assert "the baseline of team" in page.inner_text("#run-baseline")
    shot(page, "dashboard-learn.png")

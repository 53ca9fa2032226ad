"""Where a step's time goes: the verdict on series read from real verl logs (this project's
verl CPU run, kept in the failure corpus; verl's own console sample), on series that show
verl's known gaps (both idle ratios near 0, #6693; the V1 trainer's missing idle ratios, #7601;
a weight sync that grows, #4896), the splits a change may offer, and the API's and CLI's
answer for a verl run, its change checked by the dry-run planner."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from service.cli import app as cli
from service.metrics import keys, store
from service.metrics.parse import parse_line
from service.metrics.steptime import analyse, breakdown, move, sync_trend
from service.operations.step_time import splits
from service.store.db import Database
from tests.conftest import served

DATA = Path(__file__).parent / "data"
# This project's verl CPU run (fully async trainer, verl 0.9.1, one trainer and one rollout
# accelerator), its whole job log as the service kept it.
CPU_RUN = DATA / "failures" / "actor_died-10.log"
Series = dict[str, list[tuple[int, float]]]


def series_of_log(path: Path) -> Series:
    out: Series = defaultdict(list)
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if (m := parse_line(line)) is not None:
            for key, value in m.values.items():
                out[key].append((m.step, value))
    return out


def test_the_real_cpu_run_is_rollout_bound_from_verls_own_timers() -> None:
    a = analyse(series_of_log(CPU_RUN), (1, 1))
    assert a.trainer == "fully_async"
    [step] = a.steps  # its one timed step (step:2), as verl printed it
    assert step.step == 2
    assert step.total == pytest.approx(74.1134, abs=1e-3)
    assert step.wait == pytest.approx(73.4466, abs=1e-3)
    assert step.update == pytest.approx(0.5171, abs=1e-3)
    assert step.sync == pytest.approx(0.1310, abs=1e-3)
    assert step.other == pytest.approx(step.total - step.wait - step.update - step.sync)
    assert a.verdict == "rollout-bound"
    assert a.figures["wait_share"] == pytest.approx(0.991, abs=1e-3)
    # 1 - active_time / version_time of the rollouter's line of the same step
    assert a.figures["rollout_idle"] == pytest.approx(1 - 2.789132595 / 3.319585085, abs=1e-6)
    assert a.sources["rollout_idle"] == "active_time/version_time"
    assert "99%" in a.summary
    # One accelerator each: no split evens it out, and it says so.
    assert a.to_rollout == 0
    assert any("no split of 2 accelerators" in n for n in a.notes)
    assert any("the first" in n for n in a.notes)


def test_verls_console_sample_is_balanced_with_its_figures() -> None:
    a = analyse(series_of_log(DATA / "verl_console_log_sample.txt"), (16, 16))
    assert [s.step for s in a.steps] == [1, 2, 3]
    assert a.verdict == "balanced"
    # The first step (waiting for the first rollouts) is left out of the window.
    assert a.figures["steps"] == 2
    assert a.figures["update_share"] is not None and a.figures["update_share"] > 0.6
    assert a.to_rollout == 0


def _series(n: int, **per_step: float) -> Series:
    return {k: [(s, v) for s in range(1, n + 1)] for k, v in per_step.items()}


def _timed(n: int, wait: float, update: float, sync: float, other: float = 1.0) -> Series:
    total = wait + update + sync + other
    return _series(
        n,
        **{
            keys.STEP_TIME_KEY: total,
            keys.GEN_KEY: wait,
            keys.UPDATE_ACTOR_KEY: update,
            keys.PARAM_SYNC_KEY: sync,
        },
    )


def test_both_idle_ratios_near_zero_do_not_hide_a_trainer_waiting_for_samples() -> None:
    # verl #6693: verl says both groups are busy; the trainer waits 60 % of each step.
    series = _timed(10, wait=60, update=30, sync=5, other=5) | _series(
        10, **{keys.TRAINER_IDLE_KEY: 0.01, keys.ROLLOUTER_IDLE_KEY: 0.02}
    )
    a = analyse(series, (16, 16))
    assert a.verdict == "rollout-bound"
    assert a.figures["wait_share"] == pytest.approx(0.6)
    assert any("#6693" in n for n in a.notes)
    # Trainer busy 40 % on 16, rollouts busy 98 % on 16: 32 x 6.4/(6.4+15.68) = 9.3 -> 9.
    assert a.to_rollout == 7


def test_v1_has_no_idle_ratios_and_they_are_derived_from_its_timers() -> None:
    # verl #7601: the V1 trainer logs timing_s/update_weights and separate_async/*, no idle.
    series = _series(
        8,
        **{
            keys.STEP_TIME_KEY: 10.0,
            keys.GEN_KEY: 0.2,
            keys.UPDATE_ACTOR_KEY: 8.0,
            keys.V1_SYNC_KEY: 0.5,
            keys.V1_SWITCH_IDLE_KEY: 0.0,
        },
    )
    a = analyse(series, (8, 8))
    assert a.trainer == "v1"
    assert a.figures["trainer_idle"] == pytest.approx(0.02)
    assert a.figures["rollout_idle"] is None and a.sources["rollout_idle"] == "not logged"
    assert a.verdict == "balanced"  # the rollouts' idleness is unknown: no trainer-bound guess
    assert any("#7601" in n for n in a.notes)


def test_idle_rollouts_and_a_busy_trainer_are_trainer_bound_with_a_move_to_the_trainer() -> None:
    series = _timed(12, wait=0.5, update=20, sync=0.5) | _series(
        12, **{keys.ROLLOUTER_ACTIVE_KEY: 5.0, keys.ROLLOUTER_VERSION_KEY: 10.0}
    )
    a = analyse(series, (8, 8))
    assert a.verdict == "trainer-bound"
    assert a.figures["rollout_idle"] == pytest.approx(0.5)
    assert a.to_rollout < 0


def test_a_sync_that_takes_the_step_is_sync_bound_and_its_growth_is_a_trend() -> None:
    series = _timed(12, wait=1, update=5, sync=1)
    series[keys.PARAM_SYNC_KEY] = [(s, 1.0 + s) for s in range(1, 13)]  # 2 s -> 13 s
    series[keys.STEP_TIME_KEY] = [(s, 7.0 + s) for s in range(1, 13)]
    a = analyse(series, (8, 8))
    assert a.verdict == "sync-bound"
    assert a.sync is not None and a.sync.growing
    assert a.sync.slope == pytest.approx(1.0)
    assert any("#4896" in n for n in a.notes)
    assert a.to_rollout == 0  # no device split fixes a slow sync


def test_a_steady_sync_is_no_trend_and_few_syncs_tell_none() -> None:
    trend = sync_trend([(s, 2.0 + 0.01 * (s % 2)) for s in range(20)])
    assert trend is not None and not trend.growing
    assert sync_trend([(1, 1.0), (2, 9.0)]) is None


def test_no_timed_step_is_unknown() -> None:
    a = analyse({}, (8, 8))
    assert a.verdict == "unknown" and a.steps == []
    assert breakdown({})[1] == "unknown"


def test_move_keeps_one_accelerator_in_each_group() -> None:
    assert move(1, 1, 0.01, 1.0) == 0
    assert move(2, 1, 0.01, 1.0) == 1
    assert move(8, 8, 1.0, 0.5) == -3  # 16 x 8/(8+4) = 10.7 -> 11 trainer


def test_splits_keep_node_counts_and_go_the_way_asked() -> None:
    resources = {
        "n_gpus_training": 8,
        "n_nodes_train": 2,
        "n_gpus_rollout": 8,
        "n_nodes_rollout": 2,
    }
    out = splits(resources, 8)
    assert out[0] == resources | {"n_gpus_training": 4, "n_gpus_rollout": 12}
    assert all(s["n_gpus_training"] < 8 for s in out)
    assert all(s["n_nodes_train"] == 2 and s["n_nodes_rollout"] == 2 for s in out)
    assert splits(resources, -4)[0]["n_gpus_training"] == 10


PRESET = {"recipe": "verl-fully-async", "preset": "geo3k-qwen3vl-8b-npu"}


def rollout_bound(steps: int = 10) -> list[str]:
    """verl's lines of ``steps`` steps in which the trainer waits 60 % of each while verl calls
    both groups busy (#6693)."""
    return [
        f"step:{n} - {keys.STEP_TIME_KEY}:100.0 - {keys.GEN_KEY}:60.0 - "
        f"{keys.UPDATE_ACTOR_KEY}:30.0 - {keys.PARAM_SYNC_KEY}:5.0 - "
        f"{keys.TRAINER_IDLE_KEY}:0.01 - {keys.ROLLOUTER_IDLE_KEY}:0.02"
        for n in range(1, steps + 1)
    ]


def store_lines(db_url: str, run_id: str, lines: list[str]) -> None:
    """The run's metric ``lines``, stored as the follower stores what it reads."""
    db = Database(db_url)
    try:
        parsed = [(n, m) for n, line in enumerate(lines) if (m := parse_line(line)) is not None]
        with db.transaction() as session:
            store.add_lines(session, run_id, parsed)
    finally:
        db.dispose()


def test_the_api_and_cli_say_rollout_bound_with_a_planned_move(db_url: str) -> None:
    with served(db_url) as url, httpx.Client(base_url=url, timeout=60) as api:
        resp = api.post("/runs", json=PRESET)
        assert resp.status_code == 201, resp.text
        run_id = resp.json()["id"]
        assert api.get(f"/runs/{run_id}/step-time").json()["verdict"] == "unknown"
        store_lines(db_url, run_id, rollout_bound())
        answer = api.get(f"/runs/{run_id}/step-time").json()
        assert answer["verdict"] == "rollout-bound"
        assert answer["figures"]["wait_share"] == pytest.approx(0.6)
        assert (answer["trainer_accelerators"], answer["rollout_accelerators"]) == (16, 16)
        assert [s["step"] for s in answer["steps"]] == list(range(1, 11))
        change = answer["change"]
        assert change is not None, answer
        assert change["from"] == "trainer" and change["to"] == "rollout"
        after = change["resources"]["after"]
        assert after["n_gpus_training"] < 16 and after["n_gpus_rollout"] > 16
        assert change["summary"].startswith(f"move {change['accelerators']} NPUs from the trainer")
        # Ready to submit: the planner takes it as a new run.
        planned = api.post("/runs", params={"dry_run": "true"}, json=change["spec"])
        assert planned.status_code == 200, planned.text
        assert planned.json()["plan"]["feasible_ever"] is not False
        result = CliRunner().invoke(cli, ["why-slow", run_id, "--server", url])
        assert result.exit_code == 0, result.output
        assert result.stdout.startswith("rollout-bound: the trainer waits for samples 60%")
        assert f"change: {change['summary']}" in result.stdout
        assert api.get("/runs/nope/step-time").status_code == 404

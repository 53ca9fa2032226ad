"""verl's own fully async trainer, for real, under the service: the session's one cpu-learn run
(``tests/verl_run.py``) on the embedded local Ray head (CPU only), from POST /runs to SUCCEEDED,
its console metrics under verl's key names and its checkpoints.

Slow (the run is 1.5-10 minutes on two cores, most of it start-up), and it needs the trainer
stack (rlrun[verl-cpu], README): without it these fail, never skip.
"""

from __future__ import annotations

import json

import pytest

from service.metrics.keys import STEP_KEY
from service.recipes.verl.preset import LEARN_SAVE_EVERY, LEARN_SYNCS
from tests.verl_run import VerlRun

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.timeout(2400)]

# The verl run view's charts (service/static/run.js) that verl 0.9.1 logs on this path.
CHARTED = {
    "critic/score/mean",
    "critic/score/max",
    "critic/score/min",
    "fully_async/trainer/idle_ratio",
    "fully_async/rollouter/idle_ratio",
    "fully_async/count/staleness_samples",
    "fully_async/count/stale_trajectory_processed",
    "fully_async/partial/partial_ratio",
    "timing_s/timing_s/param_sync",
    "fully_async/count/current_param_version",
}


def test_cpu_learn_trains_for_real_and_ends_succeeded(verl_run: VerlRun) -> None:
    run = verl_run.run
    assert run["status"] == "SUCCEEDED", json.dumps(run)[:3000]
    statuses = [e["to_status"] for e in run["events"]]
    assert statuses[0] == "QUEUED" and "RUNNING" in statuses and statuses[-1] == "SUCCEEDED"


def test_the_charts_keys_are_verls_own(verl_run: VerlRun) -> None:
    keys = set(verl_run.http.get(f"/runs/{verl_run.run_id}/metrics/keys").json())
    # verl's own key names, as the dashboard's verl charts draw them (a chart whose keys a run
    # never logs is not drawn: verl 0.9.1 logs no fully_async/count/mean_staleness).
    assert keys >= CHARTED, CHARTED - keys


def test_progress_is_the_parameter_version_the_trainer_synced(verl_run: VerlRun) -> None:
    # verl's step lines lag (they stop at version LEARN_SYNCS - 2); its own sync lines do not.
    progress = verl_run.run["progress"]
    assert (progress["step"], progress["total_steps"]) == (LEARN_SYNCS, LEARN_SYNCS), progress
    # One version per step, each once: 0 (the first sync) to the last.
    series = verl_run.http.get(
        f"/runs/{verl_run.run_id}/metrics", params={"keys": STEP_KEY, "max_points": 1000}
    ).json()["series"][STEP_KEY]
    versions = [(p["step"], p["value"]) for p in series]
    assert versions == [(v, float(v)) for v in range(LEARN_SYNCS + 1)], versions


def test_verl_wrote_its_checkpoints_in_its_own_layout(verl_run: VerlRun) -> None:
    tree = verl_run.checkpoints
    assert (tree / "latest_checkpointed_iteration.txt").read_text().strip() == str(LEARN_SYNCS)
    for step in range(LEARN_SAVE_EVERY, LEARN_SYNCS + 1, LEARN_SAVE_EVERY):
        actor = tree / f"global_step_{step}" / "actor"
        assert (tree / f"global_step_{step}" / "data.pt").is_file()
        assert (actor / "model_world_size_1_rank_0.pt").is_file()
        assert (actor / "optim_world_size_1_rank_0.pt").is_file()

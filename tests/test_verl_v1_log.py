"""What the service reads of a real log of verl's V1 trainer (``trainer_mode: separate_async``,
``tests/data/verl_v1_cpu_smoke.log``: verl 0.9.1 on CPU, 2 trainer steps, SUCCEEDED): its metrics
under V1's own names, its progress from the version it syncs once a step, and the truthful end
against the planned steps."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from service.loops.follower import Follower
from service.loops.reconciler import Reconciler
from service.metrics import store
from service.metrics.health import HealthRules
from service.metrics.keys import STEP_KEY, TRAINER_STEP_KEY
from service.metrics.log_readers import WholeLogReader
from service.operations import run_docs
from service.recipes.base import Launch
from service.scheduling.shape import ResourceShape
from service.store.db import Database
from service.store.models import Run
from service.store.status import RunStatus
from tests.factories import add_run, read_run
from tests.fake_ray import FakeRay

LOG = Path(__file__).parent / "data" / "verl_v1_cpu_smoke.log"
V1_KEYS = {
    TRAINER_STEP_KEY,
    "critic/score/mean",
    "actor/pg_loss",
    "training/off_policy/trajectory_staleness/mean",
    "training/off_policy/trajectory_spans/mean",
    "timing_s/update_weights",
}


def _launch(total: int) -> dict[str, object]:
    launch = Launch(["true"], {}, ResourceShape(), total_steps=total, progress_key=TRAINER_STEP_KEY)
    return launch.as_dict()


def _end(db: Database, total: int) -> Run:
    ray = FakeRay()
    reconciler = Reconciler(db, ray)
    follower = Follower(
        db, ray, "me", 30.0, 100_000, HealthRules(), reader=WholeLogReader(ray), on_end=lambda: None
    )
    add_run(db, "r1", RunStatus.RUNNING, launch=_launch(total))
    ray.log["r1"] = LOG.read_text()
    ray.set_status("r1", "SUCCEEDED", exit_code=0)
    reconciler.tick()
    with db.transaction() as s:  # Ray's word is older than the follower's wait for last lines
        run = s.get(Run, "r1")
        assert run is not None and run.ray_ended_at is not None
        run.ray_ended_at -= timedelta(seconds=5)
    follower.tick()
    return read_run(db)[0]


@pytest.mark.parametrize(("planned", "end"), [(2, RunStatus.SUCCEEDED), (3, RunStatus.FAILED)])
def test_a_real_v1_log_ends_as_its_trainer_steps_against_the_plan(
    db: Database, planned: int, end: RunStatus
) -> None:
    run = _end(db, planned)
    assert run.status == end
    with db.read() as s:
        latest = store.latest(s, "r1")
        keys = set(store.keys_of(s, "r1"))
    assert keys >= V1_KEYS, V1_KEYS - keys
    assert not [k for k in keys if k.startswith("fully_async/")] and STEP_KEY not in keys
    # The printed step is the trainer step, one weight sync each: the run's progress.
    assert latest[TRAINER_STEP_KEY] == (2, 2.0)
    progress = run_docs.progress_doc(planned, latest, TRAINER_STEP_KEY)
    assert progress["step"] == 2 and progress["key"] == TRAINER_STEP_KEY
    if end == RunStatus.FAILED:
        assert run.failure is not None and run.failure["class"] == "ended_early"
        assert run.failure["summary"].startswith("trained 2 of 3 steps")

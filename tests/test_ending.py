"""A truthful end, one loop tick at a time against an in-memory Ray: a job Ray reports SUCCEEDED
ends its run only once the log is read to the end, FAILED when it trained short of its plan or
logged a fatal error, never SUCCEEDED first."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select

from service.loops.follower import Follower
from service.loops.reconciler import Reconciler
from service.metrics import store
from service.metrics.keys import STEP_KEY
from service.operations import run_docs
from service.recipes.base import Launch
from service.recovery import ending
from service.scheduling.shape import ResourceShape
from service.store.db import Database
from service.store.models import Run, RunEvent, utcnow
from service.store.status import RunStatus
from tests.factories import add_run, read_run, whole_log_follower
from tests.fake_ray import FakeRay


def _steps(n: int) -> str:
    return "".join(
        f"step:{i} - fully_async/count/current_param_version:{i} - critic/score/mean:0.5\n"
        for i in range(1, n + 1)
    )


def _planned(total: int | None) -> dict[str, object]:
    return Launch(["true"], {}, ResourceShape(), total_steps=total).as_dict()


def _loops(db: Database, ray: FakeRay, ended: list[bool]) -> tuple[Reconciler, Follower]:
    return Reconciler(db, ray), whole_log_follower(db, ray, on_end=lambda: ended.append(True))


def _exited_0(
    db: Database, log: str, planned: int | None, status: RunStatus = RunStatus.RUNNING
) -> tuple[Reconciler, Follower, list[bool]]:
    """Run r1, ``status`` in the store with ``planned`` steps, whose job Ray reports exited 0
    with ``log``; the loops that decide its end, and whether it ended."""
    ray, ended = FakeRay(), []
    add_run(db, "r1", status, launch=_planned(planned))
    ray.log["r1"] = log
    ray.set_status("r1", "SUCCEEDED", exit_code=0)
    return *_loops(db, ray, ended), ended


def _decide(db: Database, reconciler: Reconciler, follower: Follower) -> Run:
    """Ray's word is read, it ages past the wait for the last lines, the log is read."""
    reconciler.tick()
    _seen_long_enough_ago(db)
    follower.tick()
    return read_run(db)[0]


def _seen_long_enough_ago(db: Database) -> None:
    """Ray's word is older than the follower's wait for the last lines (FINAL_READ_AFTER)."""
    with db.transaction() as s:
        run = s.get(Run, "r1")
        assert run is not None and run.ray_ended_at is not None
        run.ray_ended_at -= timedelta(seconds=5)


def _just_seen(db: Database) -> None:
    """Ray's word is fresh, however long the ticks took on a loaded machine."""
    with db.transaction() as s:
        run = s.get(Run, "r1")
        assert run is not None and run.ray_ended_at is not None
        run.ray_ended_at = utcnow()


def _statuses(db: Database) -> list[str]:
    with db.read() as s:
        rows = s.scalars(select(RunEvent).where(RunEvent.run_id == "r1").order_by(RunEvent.id))
        return [e.to_status for e in rows if e.from_status != e.to_status]


def test_a_job_that_exits_0_after_3_of_30_steps_ends_failed_ended_early_never_succeeded(
    db: Database,
) -> None:
    reconciler, follower, ended = _exited_0(db, _steps(3), 30)
    reconciler.tick()
    run, reasons = read_run(db)
    assert run.status == RunStatus.RUNNING and run.ray_status == "SUCCEEDED"
    assert reasons[-1].startswith("Ray reports the job finished")
    _seen_long_enough_ago(db)
    follower.tick()
    run, reasons = read_run(db)
    assert run.status == RunStatus.FAILED and ended == [True]
    assert run.failure is not None and run.failure["class"] == "ended_early"
    assert run.failure["summary"].startswith("trained 3 of 30 steps")
    assert "step:3 - " in run.failure["evidence"][0]["line"]
    assert reasons[-1].startswith("ended_early: trained 3 of 30 steps")
    assert "SUCCEEDED" not in _statuses(db)
    reconciler.tick()  # Ray's word, read again, changes nothing
    follower.tick()
    assert read_run(db)[0].status == RunStatus.FAILED and "SUCCEEDED" not in _statuses(db)


def test_a_run_ended_early_keeps_the_error_lines_no_rule_names_beside_its_last_step(
    db: Database,
) -> None:
    crash = "Traceback (most recent call last):\nValueError: reward returned a string\n"
    reconciler, follower, _ = _exited_0(db, _steps(3) + crash, 30)
    run = _decide(db, reconciler, follower)
    assert run.failure is not None and run.failure["class"] == "ended_early"
    lines = [e["line"] for e in run.failure["evidence"]]
    assert "step:3 - " in lines[0] and lines[-1] == "ValueError: reward returned a string"


def test_a_job_that_trained_every_planned_step_succeeds_once_its_log_is_read(
    db: Database,
) -> None:
    reconciler, follower, ended = _exited_0(db, _steps(3), 3, RunStatus.SUBMITTED)
    reconciler.tick()
    _just_seen(db)
    follower.tick()  # Ray's word is too fresh: the last lines may not be in the log yet
    assert read_run(db)[0].status == RunStatus.SUBMITTED
    _seen_long_enough_ago(db)
    follower.tick()
    run, reasons = read_run(db)
    assert run.status == RunStatus.SUCCEEDED and run.failure is None and ended == [True]
    assert reasons[-1] == "the job finished successfully"


def test_a_fatal_error_in_a_log_that_exited_0_is_the_class_found(db: Database) -> None:
    oom = (
        "(FullyAsyncRollouter pid=77) Traceback (most recent call last):\n"
        '(FullyAsyncRollouter pid=77)   File "/verl/experimental/fully_async_policy/'
        'fully_async_rollouter.py", line 412, in _processor_worker\n'
        "(FullyAsyncRollouter pid=77) RuntimeError: NPU out of memory. Tried to allocate 2.00 GiB\n"
        "(FullyAsyncTrainer pid=78) no more data: training ends\n"
    )
    reconciler, follower, _ = _exited_0(db, _steps(2) + oom, None)  # no plan: the error decides
    run = _decide(db, reconciler, follower)
    assert run.status == RunStatus.FAILED and run.failure is not None
    assert run.failure["class"] == "npu_oom" and "exited 0" in run.failure["summary"]


def test_a_traceback_in_a_run_that_trained_every_planned_step_was_survived(
    db: Database,
) -> None:
    survived = (
        _steps(1)
        + "(vLLMHttpServer pid=9) Traceback (most recent call last):\n"
        + "(vLLMHttpServer pid=9) RuntimeError: NPU out of memory. Tried to allocate 2.00 GiB\n"
        + "(vLLMHttpServer pid=9) retrying the request with a smaller batch\n"
        + _steps(3)[len(_steps(1)) :]
    )
    reconciler, follower, _ = _exited_0(db, survived, 3)
    run = _decide(db, reconciler, follower)
    assert run.status == RunStatus.SUCCEEDED and run.failure is None


def test_a_log_not_read_to_the_end_in_time_is_decided_from_what_is_stored(db: Database) -> None:
    ray = FakeRay()
    add_run(db, "r1", RunStatus.RUNNING, launch=_planned(30))
    ray.set_status("r1", "SUCCEEDED", exit_code=0)
    reconciler = Reconciler(db, ray)
    reconciler.tick()
    assert read_run(db)[0].status == RunStatus.RUNNING
    with db.transaction() as s:
        run = s.get(Run, "r1")
        assert run is not None
        run.ray_ended_at = utcnow() - ending.WAIT - timedelta(seconds=1)
    reconciler.tick()
    run, reasons = read_run(db)
    assert run.status == RunStatus.FAILED and run.failure is not None
    assert run.failure["class"] == "ended_early" and "not read to the end" in reasons[-1]


def test_a_verl_job_whose_data_holds_fewer_samples_than_asked_is_held_to_what_it_planned(
    db: Database,
) -> None:
    ray, ended = FakeRay(), []
    reconciler, follower = _loops(db, ray, ended)
    launch = Launch(["true"], {}, ResourceShape(), total_steps=30, samples_per_sync=64).as_dict()
    add_run(db, "r1", RunStatus.RUNNING, launch=launch)
    add_run(db, "r2", RunStatus.RUNNING, launch=launch)
    # verl trains min(total_rollout_steps, the data's size): 192 samples are 3 syncs of 64.
    planned = "(FullyAsyncRollouter pid=9) [FullyAsyncRollouter] Total rollout steps: 192\n"
    ray.log["r1"] = planned + _steps(3)
    ray.log["r2"] = planned + _steps(2)
    for run_id in ("r1", "r2"):
        ray.set_status(run_id, "SUCCEEDED", exit_code=0)
    reconciler.tick()
    with db.transaction() as s:
        for run in s.scalars(select(Run)):
            assert run.ray_ended_at is not None
            run.ray_ended_at -= timedelta(seconds=5)
    follower.tick()
    assert read_run(db, "r1")[0].status == RunStatus.SUCCEEDED
    short, _ = read_run(db, "r2")
    assert short.status == RunStatus.FAILED and short.failure is not None
    assert short.failure["summary"].startswith("trained 2 of 3 steps")


# As verl 0.9.1's fully async trainer prints a finished run of 3 syncs (seen in the cpu-smoke
# run): its step lines carry the version a step trained with and stop one step early; only the
# trainer's own lines name the last version synced.
_VERL_3_OF_3 = "".join(
    f"(FullyAsyncTrainer pid=7) [FullyAsyncTrainer] _fit_update_weights, timing_s/param_sync: "
    f"0.12 seconds self.current_param_version: {v}\n"
    + (
        f"(FullyAsyncTrainer pid=7) step:{v} - training/global_step:{v - 1}.0 - "
        f"fully_async/count/current_param_version:{v - 2}.0\n"
        if v >= 2
        else ""
    )
    for v in range(4)
)


@pytest.mark.parametrize(("planned", "end"), [(3, RunStatus.SUCCEEDED), (4, RunStatus.FAILED)])
def test_a_verl_run_is_held_to_the_versions_its_trainer_synced_not_its_lagging_step_lines(
    db: Database, planned: int, end: RunStatus
) -> None:
    reconciler, follower, _ = _exited_0(db, _VERL_3_OF_3, planned)
    run = _decide(db, reconciler, follower)
    # 3 synced: finished though its step lines print version 1; of 4, short however it exited.
    assert run.status == end
    # Its progress is the trainer's word too: version 3, at step 3 (not its lagging line's 1).
    with db.read() as s:
        assert store.latest(s, "r1")[STEP_KEY] == (3, 3.0)
        assert run_docs.progress_doc(planned, store.latest(s, "r1"))["step"] == 3
    if end == RunStatus.FAILED:
        assert run.failure is not None
        assert run.failure["summary"].startswith("trained 3 of 4 steps")

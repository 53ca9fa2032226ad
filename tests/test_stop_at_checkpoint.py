"""A stop at the next checkpoint, one loop tick at a time against an in-memory Ray: the job's
checkpoint lines become events, a run waiting for one stops right after it (0 steps lost) or
when its time runs out (the steps since its last save lost), and a deadline asks for the same;
the cancel route's body is checked before anything is stored."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from jobs import checkpoints
from service.loops.reconciler import Reconciler
from service.metrics.parse import parse_checkpoint
from service.recipes.base import LaunchContext
from service.recipes.registry import default_registry
from service.settings import Settings
from service.store.db import Database
from service.store.lifecycle import request_yield
from service.store.models import Run, RunEvent, utcnow
from service.store.status import RunStatus
from tests.factories import add_run, read_run, whole_log_follower
from tests.fake_ray import FakeRay


def _step(n: int) -> str:
    return f"step:{n} - critic/score/mean:0.5\n"


def _saved(n: int) -> str:
    return (
        f"(TinyGrpo pid=1) {checkpoints.PREFIX}"
        + f'{{"step": {n}, "path": "/c/global_step_{n}"}}\n'
    )


class Loops:
    """The reconciler and a follower on one database and one Ray in memory; ``woken`` lists
    each loop the follower woke on a checkpoint."""

    def __init__(self, db: Database) -> None:
        self.db, self.ray, self.woken = db, FakeRay(), list[str]()
        self.reconciler = Reconciler(db, self.ray, deadline_margin_s=60.0)
        self.follower = whole_log_follower(
            db, self.ray, on_checkpoint=lambda: self.woken.append("reconciler")
        )

    def running(self, run_id: str = "r1", **fields: Any) -> None:
        """A stored run (``fields`` of it) that Ray runs."""
        add_run(self.db, run_id, RunStatus.RUNNING, **fields)
        self.ray.set_status(run_id, "RUNNING")

    def stopped(self, run_id: str = "r1") -> tuple[Run, list[str]]:
        """The reconciler ticks twice (asks Ray to stop, records the end): the run and the
        reasons of its events."""
        self.reconciler.tick()
        self.reconciler.tick()
        return read_run(self.db, run_id)


@pytest.fixture
def loops(db: Database) -> Loops:
    return Loops(db)


def _wait_over(loops: Loops, run_id: str = "r1", deadline: bool = False) -> tuple[Run, list[str]]:
    """The run's wait for a checkpoint has run out (with ``deadline``, its deadline passed too):
    the run once stopped, and its reasons."""
    with loops.db.transaction() as s:
        run = s.get(Run, run_id)
        assert run is not None and run.yield_by is not None
        run.yield_by = utcnow() - timedelta(seconds=1)
        if deadline:
            run.deadline_at = run.yield_by
    return loops.stopped(run_id)


def _events(db: Database, run_id: str = "r1") -> list[tuple[str | None, int | None, str]]:
    with db.read() as s:
        rows = s.scalars(select(RunEvent).where(RunEvent.run_id == run_id).order_by(RunEvent.id))
        return [(e.kind, e.step, e.reason) for e in rows]


def _yield(db: Database, within_s: float, reason: str = "cancelled by alice") -> None:
    with db.transaction() as s:
        run = s.get(Run, "r1", with_for_update=True)
        assert run is not None
        assert request_yield(s, run, within_s, reason)


def test_the_one_parser_reads_a_checkpoint_line_and_nothing_else() -> None:
    assert parse_checkpoint(_saved(12)) == 12
    assert (
        parse_checkpoint(f'\x1b[36m(pid=4, ip=1.2.3.4)\x1b[0m {checkpoints.PREFIX}{{"step": 3}}')
        == 3
    )
    for line in (
        "step:3 - a:1",
        f"{checkpoints.PREFIX}not json",
        f'{checkpoints.PREFIX}{{"step": -1}}',
        f'{checkpoints.PREFIX}{{"step": true}}',
        f'{checkpoints.PREFIX}{{"step": "3"}}',
        f"{checkpoints.PREFIX}[3]",
        f'echo {checkpoints.PREFIX}{{"step": 3}}',  # not at the start of the job's line
    ):
        assert parse_checkpoint(line) is None, line


def test_a_run_waiting_for_its_next_checkpoint_stops_right_after_it_with_0_steps_lost(
    db: Database, loops: Loops
) -> None:
    ray, reconciler, follower = loops.ray, loops.reconciler, loops.follower
    loops.running()
    ray.log["r1"] = _step(1) + _step(2) + _saved(2) + _step(3)
    follower.tick()
    run, _ = read_run(db)
    assert (run.checkpoint_step, run.stop_requested_at) == (2, None)
    assert loops.woken == ["reconciler"]
    _yield(db, 600)
    ray.log["r1"] += _saved(2)  # said again (a re-read, a watcher restarted): not a new save
    follower.tick()
    reconciler.tick()
    assert read_run(db)[0].stop_requested_at is None and ray.stopped == []
    ray.log["r1"] += _step(4) + _saved(4)
    follower.tick()
    run, _ = read_run(db)
    assert run.stop_requested_at is not None
    assert (run.stop_saved_step, run.stop_lost_steps) == (4, 0)
    run, reasons = loops.stopped()  # the stop delivered, Ray stops the job
    assert ray.stopped and run.status == RunStatus.STOPPED
    assert reasons[-1] == "cancelled by alice: stopped at checkpoint step 4, 0 steps lost"
    kinds = [(k, s) for k, s, _ in _events(db) if k]
    assert kinds == [("checkpoint", 2), ("stop_requested", None), ("checkpoint", 4)]


def test_when_the_wait_runs_out_the_run_stops_with_the_steps_since_its_last_save_lost(
    db: Database, loops: Loops
) -> None:
    ray, reconciler, follower = loops.ray, loops.reconciler, loops.follower
    loops.running()
    ray.log["r1"] = _step(1) + _step(2) + _saved(2) + _step(3) + _step(4) + _step(5)
    follower.tick()
    _yield(db, 3600)
    reconciler.tick()
    assert read_run(db)[0].stop_requested_at is None  # an hour to go
    run, reasons = _wait_over(loops)  # the hour has passed
    assert run.status == RunStatus.STOPPED and (run.stop_saved_step, run.stop_lost_steps) == (2, 3)
    assert "no checkpoint in time: 3 steps lost since step 2" in reasons[-2]
    assert reasons[-1] == "cancelled by alice: stopped at checkpoint step 2, 3 steps lost"


def test_a_run_near_its_deadline_is_asked_to_stop_at_its_next_checkpoint_and_stopped_at_it(
    db: Database, loops: Loops
) -> None:
    ray, reconciler, follower = loops.ray, loops.reconciler, loops.follower
    now = utcnow()
    far = now + timedelta(hours=2)
    loops.running("r1", submitted_at=now, deadline_at=far)
    soon = now + timedelta(seconds=30)
    loops.running("r2", submitted_at=now - timedelta(seconds=70), deadline_at=soon)
    ray.log["r2"] = _step(1)
    follower.tick()
    reconciler.tick()
    assert read_run(db, "r1")[0].yield_by is None  # two hours to go: the margin is a minute
    run, reasons = read_run(db, "r2")
    assert run.yield_by is not None and abs((run.yield_by - run.deadline_at).total_seconds()) < 2
    assert re.match(r"stop at the next checkpoint requested \(within (29|30) s\)", reasons[-1])
    assert reasons[-1].endswith("deadline: 100 s from admission")
    run, reasons = _wait_over(loops, "r2", deadline=True)  # before any save
    assert run.status == RunStatus.STOPPED
    assert reasons[-1] == "deadline: 100 s from admission: stopped with no checkpoint, 1 steps lost"


def test_a_run_that_saves_seldom_is_asked_one_save_interval_before_its_deadline(
    db: Database, loops: Loops
) -> None:
    loops.running(deadline_at=utcnow() + timedelta(seconds=500), checkpoint_every_s=400)
    loops.reconciler.tick()  # 500 s left, a minute's margin, but its saves come 400 s apart
    assert read_run(db)[0].yield_by is not None


def test_a_cancel_body_asks_for_a_stop_at_the_next_checkpoint_bad_ones_change_nothing(
    api: TestClient, db: Database
) -> None:
    add_run(db, "r1", RunStatus.RUNNING)
    add_run(db, "r2", RunStatus.RUNNING)
    before = _events(db)
    for body, field in (
        ({"at": "next_checkpoint", "within_s": -1}, "within_s"),
        ({"at": "next_checkpoint", "within_s": 1e12}, "within_s"),
        ({"at": "next_checkpoint", "within_s": "soon"}, "within_s"),
        ({"at": "later"}, "at"),
        ({"at": "next_checkpoint", "grace": 5}, "grace"),
    ):
        resp = api.post("/runs/r1/cancel", json=body)
        assert resp.status_code == 422, (body, resp.text)
        assert resp.headers["content-type"].startswith("application/problem+json")
        assert [e["field"] for e in resp.json()["errors"]] == [field], resp.json()
    run, _ = read_run(db)
    assert (run.yield_by, run.stop_requested_at, _events(db)) == (None, None, before)
    resp = api.post("/runs/r1/cancel", json={"at": "next_checkpoint", "within_s": 120})
    assert resp.status_code == 200, resp.text
    doc = resp.json()
    assert doc["stop_requested"] is False and doc["status"] == "RUNNING"
    assert doc["stop"]["at"] == "next_checkpoint" and doc["stop"]["then"] == "STOPPED"
    assert doc["events"][-1]["kind"] == "stop_requested"
    assert "within 120 s" in doc["events"][-1]["reason"]
    plain = api.post("/runs/r2/cancel").json()  # no body: a stop now, as before
    assert plain["stop_requested"] is True and plain["stop"] is None


def test_a_target_on_a_key_tiny_grpo_never_logs_is_refused_and_verl_s_is_warned_about(
    api: TestClient, db: Database, tmp_path: Path
) -> None:
    target = {"key": "val-core/tiny/arith/acc/mean", "op": ">=", "value": 0.9, "for_steps": 2}
    resp = api.post("/runs", json={"recipe": "tiny-grpo", "stop_when": target})
    assert resp.status_code == 422, resp.text
    (error,) = resp.json()["errors"]
    assert error["field"] == "stop_when.key"
    assert "never logs" in error["msg"] and "'val-core/tiny/arith/acc/mean@1'" in error["msg"]
    for bad, field in (
        ({"key": "critic/score/mean", "op": "~", "value": 1}, "stop_when.op"),
        ({"key": "critic/score/mean", "op": ">=", "value": "nan"}, "stop_when.value"),
        (
            {"key": "critic/score/mean", "op": ">=", "value": 1, "for_steps": 0},
            "stop_when.for_steps",
        ),
    ):
        resp = api.post("/runs", json={"recipe": "tiny-grpo", "stop_when": bad})
        assert resp.status_code == 422 and resp.json()["errors"][0]["field"] == field, resp.text
    with db.read() as s:
        assert s.scalar(select(Run.id)) is None  # nothing stored
    ok = {"recipe": "tiny-grpo", "stop_when": target | {"key": "val-core/tiny/arith/acc/mean@1"}}
    assert api.post("/runs", params={"dry_run": True}, json=ok).status_code == 200
    settings = Settings(
        verl_data_dir="/mnt/data",
        verl_model_dir="/mnt/models",
        verl_checkpoint_root="/mnt/ckpt",
        verl_cache_dir=str(tmp_path),
    )
    body = {"recipe": "verl-fully-async", "preset": "geo3k-qwen3vl-8b-npu"}
    verl = default_registry("", settings)
    for key, warned in (("val-core/geo3k/reward/mean@1", False), ("val_reward", True)):
        rule = {"key": key, "op": ">=", "value": 0.8}
        launch = verl.build(body | {"stop_when": rule}, LaunchContext("run-x"))[1]
        said = [w for w in launch.warnings if w.startswith("stop_when.key")]
        assert bool(said) is warned, launch.warnings


def test_a_run_that_reaches_its_target_stops_at_its_next_checkpoint_and_succeeds(
    db: Database, loops: Loops
) -> None:
    ray, follower = loops.ray, loops.follower
    rule = {"key": "critic/score/mean", "op": ">=", "value": 0.8, "for_steps": 2}
    loops.running(spec={"stop_when": rule})
    line = "step:{} - critic/score/mean:{}\n"
    ray.log["r1"] = line.format(1, 0.5) + line.format(2, 0.9) + line.format(3, 0.4)
    follower.tick()
    assert read_run(db)[0].yield_by is None  # one step past the line, then below it
    ray.log["r1"] += line.format(4, 0.85)
    follower.tick()
    assert read_run(db)[0].yield_by is None
    ray.log["r1"] += line.format(5, 0.95)
    follower.tick()
    run, reasons = read_run(db)
    assert run.yield_then == "SUCCEEDED" and run.stop_requested_at is None
    assert "target reached at step 5 (critic/score/mean >= 0.8 for 2 steps)" in reasons[-1]
    ray.log["r1"] += _saved(5)
    follower.tick()
    run, reasons = loops.stopped()
    assert run.status == RunStatus.SUCCEEDED
    assert reasons[-1] == (
        "target reached at step 5 (critic/score/mean >= 0.8 for 2 steps): "
        "stopped at checkpoint step 5, 0 steps lost"
    )


def test_a_target_read_late_names_the_step_it_was_reached_at_and_the_save_after_it(
    db: Database, loops: Loops
) -> None:
    rule = {"key": "training/global_step", "op": ">=", "value": 6, "for_steps": 1}
    loops.running(spec={"stop_when": rule})
    loops.ray.log["r1"] = "".join(
        f"step:{v} - training/global_step:{2 * v}\n" + (_saved(v) if v % 2 == 0 else "")
        for v in range(1, 9)
    )
    loops.follower.tick()  # one read: steps 1-8, saves at 2, 4, 6, 8
    run, reasons = loops.stopped()
    assert run.status == RunStatus.SUCCEEDED
    assert reasons[-1] == (
        "target reached at step 3 (training/global_step >= 6 for 1 steps): "
        "stopped at checkpoint step 4, 0 steps lost"
    )

"""The reconciler, one tick at a time against an in-memory Ray: what Ray says becomes the status."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from service.cluster.ray_jobs import RayUnavailable
from service.loops.reconciler import Reconciler
from service.store.db import Database
from service.store.lifecycle import request_stop
from service.store.models import AuditEntry, Run
from service.store.status import RunStatus
from tests.factories import add_run, read_run
from tests.fake_ray import FakeRay


def status_and_reasons(db: Database) -> tuple[str, list[str]]:
    run, reasons = read_run(db)
    return run.status, reasons


def test_ray_s_running_becomes_the_run_s_its_success_waits_for_the_log_and_an_end_wakes_the_queue(
    db: Database,
) -> None:
    ray, ended = FakeRay(), []
    loop = Reconciler(db, ray, on_end=lambda: ended.append(True))
    add_run(db, "r1", RunStatus.SUBMITTED)
    ray.set_status("r1", "PENDING")
    loop.tick()
    assert status_and_reasons(db) == ("SUBMITTED", [])
    ray.set_status("r1", "RUNNING")
    loop.tick()
    assert status_and_reasons(db) == ("RUNNING", ["Ray reports the job running"])
    assert ended == []
    ray.set_status("r1", "SUCCEEDED")
    loop.tick()  # the follower ends the run once its log is read (test_ending)
    assert status_and_reasons(db)[0] == "RUNNING" and ended == []
    add_run(db, "r2", RunStatus.RUNNING)
    ray.set_status("r2", "FAILED", error_type="JOB_FAILED")
    loop.tick()
    assert read_run(db, "r2")[0].status == "FAILED" and ended == [True]


def test_a_failure_keeps_ray_s_error_exit_code_and_last_message_line(db: Database) -> None:
    ray = FakeRay()
    add_run(db, "r1", RunStatus.RUNNING)
    ray.set_status(
        "r1", "FAILED", "Traceback...\nValueError: boom", error_type="JOB_FAILED", exit_code=3
    )
    Reconciler(db, ray).tick()
    status, reasons = status_and_reasons(db)
    assert status == "FAILED" and reasons == ["JOB_FAILED: exit code 3: ValueError: boom"]
    run, _ = read_run(db)
    assert run.ray_exit_code == 3 and run.ray_error_type == "JOB_FAILED"


def test_a_job_ray_no_longer_knows_is_lost(db: Database) -> None:
    add_run(db, "r1", RunStatus.RUNNING)
    Reconciler(db, FakeRay()).tick()
    status, reasons = status_and_reasons(db)
    assert status == "LOST" and "Ray no longer knows job r1" in reasons[0]


def test_a_stop_request_is_delivered_to_ray_until_the_job_stops(db: Database) -> None:
    ray = FakeRay()
    ray.stop_ends_job = False  # the job takes its grace period to exit
    add_run(db, "r1", RunStatus.RUNNING)
    ray.set_status("r1", "RUNNING")
    with db.transaction() as s:
        run = s.get(Run, "r1")
        assert run is not None and request_stop(s, run, "by hand")
        assert not request_stop(s, run, "twice")  # one request is enough
    loop = Reconciler(db, ray)
    loop.tick()
    loop.tick()
    assert ray.stopped == ["r1", "r1"] and status_and_reasons(db)[0] == "RUNNING"
    ray.set_status("r1", "STOPPED")
    loop.tick()
    assert status_and_reasons(db) == (
        "STOPPED",
        ["stop requested: by hand", "the job was stopped"],
    )


def test_ray_unavailable_changes_nothing(db: Database) -> None:
    ray = FakeRay()
    add_run(db, "r1", RunStatus.RUNNING)
    ray.fail("get", RayUnavailable("no answer"))
    with pytest.raises(RayUnavailable):
        Reconciler(db, ray).tick()
    assert status_and_reasons(db) == ("RUNNING", [])


def audit_actions(db: Database) -> list[tuple[str, str, str | None, str | None]]:
    with db.transaction() as s:
        rows = s.scalars(select(AuditEntry).order_by(AuditEntry.id))
        return [(a.user, a.action, a.run_id, a.target) for a in rows]


def test_a_stop_the_service_never_asked_for_is_recorded_as_made_outside(db: Database) -> None:
    ray = FakeRay()
    add_run(db, "r1", RunStatus.RUNNING, team="vision")
    ray.set_status("r1", "STOPPED")
    Reconciler(db, ray).tick()
    run, reasons = read_run(db)
    assert run.status == "STOPPED" and run.health == "stopped_outside"
    assert reasons[0].startswith("stopped outside rlrun: ")
    assert "stopped outside rlrun" in (run.health_reason or "")
    assert audit_actions(db) == [("ray-cluster", "run.stopped_outside", "r1", "vision")]


def test_a_stop_the_service_asked_for_is_no_stop_outside(db: Database) -> None:
    ray = FakeRay()
    add_run(db, "r1", RunStatus.RUNNING)
    ray.set_status("r1", "RUNNING")
    with db.transaction() as s:
        run = s.get(Run, "r1")
        assert run is not None and request_stop(s, run, "cancelled")
    Reconciler(db, ray).tick()
    run, reasons = read_run(db)
    assert run.status == "STOPPED" and run.health == "ok"
    assert not any("outside" in r for r in reasons) and audit_actions(db) == []

"""Hangs found from Ray's state API, one watchdog tick at a time against an in-memory Ray: a
RUNNING run without progress whose job waits for a shape no node has free is ``unschedulable``,
naming that shape, with the failure filled; the stuck timeout is the last resort, set per run."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from fastapi.testclient import TestClient

from service.loops.watchdog import Watchdog
from service.recovery import explain, pending
from service.store.db import Database
from service.store.lifecycle import request_stop, transition
from service.store.models import Run, RunLog, utcnow
from service.store.status import RunStatus
from tests.factories import add_run, read_run
from tests.fake_ray import FakeRay

NODES = {"n1": {"NPU": 8.0, "CPU": 8.0}, "n2": {"NPU": 8.0, "CPU": 8.0}}


def _ray() -> FakeRay:
    """Two 8-NPU nodes with 6 and 2 NPUs free; run r1 RUNNING on Ray."""
    ray = FakeRay({n: dict(r) for n, r in NODES.items()})
    ray.used["n1"]["NPU"], ray.used["n2"]["NPU"] = 2.0, 6.0
    ray.set_status("r1", "RUNNING")
    return ray


def _pending_actor(ray: FakeRay, npus: float, job: str = "r1") -> None:
    ray.actors.append(
        {
            "state": "PENDING_CREATION",
            "job_id": job,
            "class_name": "vLLMHttpServer",
            "required_resources": {"NPU": npus, "CPU": 1.0},
        }
    )


def _watchdog(db: Database, ray: FakeRay, **kw: Any) -> Watchdog:
    return Watchdog(db, 600, 1800, False, ray=ray, unschedulable_after_s=20, **kw)


def _started(db: Database, ago_s: float, **columns: Any) -> None:
    add_run(db, "r1", RunStatus.RUNNING, started_at=utcnow() - timedelta(seconds=ago_s), **columns)


def test_an_actor_needing_more_npus_than_any_node_has_free_is_unschedulable_until_placed(
    db: Database,
) -> None:
    ray = _ray()
    _pending_actor(ray, 8)
    _started(db, 25)
    watchdog = _watchdog(db, ray)
    watchdog.tick()
    run, _ = read_run(db)
    said = "an actor of this job (vLLMHttpServer) needs {NPU: 8, CPU: 1} on one node; "
    assert run.health == "unschedulable" and run.health_reason == said + "the largest free is 6 NPU"
    assert run.failure is not None and run.failure["class"] == "unschedulable"
    assert run.failure["summary"] == run.health_reason and "resources" in run.failure["hint"]
    ray.actors.clear()  # the holder ended: the actor was placed
    watchdog.tick()
    run, _ = read_run(db)
    assert run.health == "ok" and run.failure is None


def test_a_pending_demand_that_fits_somewhere_a_run_with_a_recent_step_and_another_job_s_actor_are_no_hang(  # noqa: E501
    db: Database,
) -> None:
    ray = _ray()
    _pending_actor(ray, 6)  # n1 has 6 free: Ray is about to place it
    _pending_actor(ray, 8, job="someone-else")
    _started(db, 25)
    add_run(db, "r2", RunStatus.RUNNING, started_at=utcnow() - timedelta(seconds=25))
    ray.set_status("r2", "RUNNING")
    _pending_actor(ray, 8, job="r2")
    with db.transaction() as s:
        s.add(RunLog(run_id="r2", log_offset=0, last_step=3, last_step_at=utcnow()))
    _watchdog(db, ray).tick()
    assert read_run(db)[0].health == "ok" and read_run(db, "r2")[0].health == "ok"


def test_a_run_is_probed_only_after_a_while_without_progress(db: Database) -> None:
    ray = _ray()
    _pending_actor(ray, 8)
    _started(db, 5)
    _watchdog(db, ray).tick()
    assert read_run(db)[0].health == "ok"


def test_a_placement_group_bundle_no_node_can_hold_is_named() -> None:
    waiting = pending.Waiting(
        {"r1": "j1"},
        [],
        [
            {
                "creator_job_id": "j1",
                "name": "rollout",
                "strategy": "PACK",
                "bundles": [{"unit_resources": {"NPU": 4.0}}, {"unit_resources": {"NPU": 8.0}}],
            }
        ],
    )
    free = {"n1": {"NPU": 6.0}, "n2": {"NPU": 2.0}}
    assert pending.missing(waiting, "r1", free) == (
        "a placement group of this job (rollout), a bundle needs {NPU: 8} on one node; "
        "the largest free is 6 NPU"
    )
    strict = [
        waiting.groups[0]
        | {"strategy": "STRICT_PACK", "bundles": waiting.groups[0]["bundles"][:1] * 2}
    ]
    assert pending.missing(pending.Waiting({"r1": "j1"}, [], strict), "r1", free) == (
        "a placement group of this job (rollout), all bundles needs {NPU: 8} on one node; "
        "the largest free is 6 NPU"
    )


def test_a_run_stopped_because_it_hung_ends_with_the_hang_as_its_failure(db: Database) -> None:
    ray = _ray()
    _pending_actor(ray, 8)
    _started(db, 25)
    _watchdog(db, ray).tick()
    with db.transaction() as s:
        run = s.get(Run, "r1")
        assert run is not None and request_stop(s, run, "by hand")
        transition(s, run, RunStatus.STOPPED, "the job was stopped")
        explain.settle(s, run)
    run, _ = read_run(db)
    assert run.failure is not None and run.failure["class"] == "unschedulable"


def test_the_stuck_timeout_is_the_last_resort_and_a_spec_sets_it_per_run(db: Database) -> None:
    ray = _ray()
    silent = utcnow() - timedelta(seconds=61)
    _started(db, 61, spec={"stuck_after_s": 60}, last_output_at=silent)
    _watchdog(db, ray).tick()  # the service's own timeout is 1800 s
    run, _ = read_run(db)
    assert run.health == "stuck" and run.health_reason == "no log output for 60 s while RUNNING"


def test_a_per_run_stuck_timeout_out_of_bounds_is_a_422_naming_the_field(api: TestClient) -> None:
    resp = api.post("/runs", json={"recipe": "test-script", "stuck_after_s": 5})
    assert resp.status_code == 422
    assert "stuck_after_s" in resp.text

"""Ray's state API as a source of a failure's class: a failed run's dead actors (their death
causes) and the dead nodes they were on, read at the follower's final read; a cause Ray names
outranks an effect in the log, and a node that held nothing of the run is no cause."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from service.cluster.ray_jobs import RayUnavailable
from service.loops.follower import Follower
from service.metrics.health import HealthRules
from service.metrics.log_readers import WholeLogReader
from service.recovery.deaths import VERDICT_WAIT
from service.store.db import Database
from service.store.models import Run, utcnow
from service.store.status import RunStatus
from tests.factories import add_run, read_run
from tests.fake_ray import FakeRay

DIED = "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.\n"


def _failed(db: Database, ray: FakeRay, log: str) -> dict[str, Any]:
    add_run(db, "r1", RunStatus.FAILED)
    with db.transaction() as s:
        run = s.get(Run, "r1")
        assert run is not None
        run.ended_at = run.started_at = (run.started_at or run.created_at) - timedelta(minutes=1)
    ray.set_status("r1", "FAILED", error_type="JOB_FAILED")
    ray.log["r1"] = log
    Follower(db, ray, "me", 30.0, 100_000, HealthRules(), reader=WholeLogReader(ray)).tick()
    failure = read_run(db)[0].failure
    assert failure is not None
    return failure


def _dead_trainer(ray: FakeRay, node: str, cause: dict[str, Any]) -> None:
    ray.dead_actors.append(
        {"job_id": "r1", "class_name": "FullyAsyncTrainer", "node_id": node, "death_cause": cause}
    )


def test_a_node_that_died_under_the_run_s_actor_outranks_the_actor_death_in_the_log(
    db: Database,
) -> None:
    ray = FakeRay()
    context = {"error_message": "The actor is dead because its node has died.", "reason": 1}
    _dead_trainer(ray, "n7", {"actor_died_error_context": context})
    ray.dead_nodes += [
        {"node_id": "n7", "node_ip": "10.0.0.7", "state_message": "missed heartbeats"},
        {"node_id": "n9", "node_ip": "10.0.0.9", "state_message": "terminated"},
    ]
    failure = _failed(db, ray, "step:1 - a:1\n" + DIED)
    assert failure["class"] == "node_lost"
    (evidence, *_) = failure["evidence"]
    assert evidence == {
        "offset": None,
        "line": "Ray's state API: node 10.0.0.7 died: missed heartbeats",
    }
    assert not any("10.0.0.9" in e["line"] for e in failure["evidence"])


def test_an_actor_ray_killed_for_host_memory_is_host_oom_though_the_log_names_no_cause(
    db: Database,
) -> None:
    ray = FakeRay()
    oom = "Task was killed due to the node running low on memory. Memory on the node was 61 GB"
    _dead_trainer(ray, "n1", {"oom_context": {"error_message": oom}})
    assert _failed(db, ray, "step:1 - a:1\nsomething ended\n")["class"] == "host_oom"


def test_an_actor_death_only_ray_knows_of_is_actor_died(db: Database) -> None:
    ray = FakeRay()
    why = "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR"
    _dead_trainer(ray, "n1", {"actor_died_error_context": {"error_message": why}})
    failure = _failed(db, ray, "step:1 - a:1\n")
    assert failure["class"] == "actor_died"
    assert failure["evidence"][0]["line"].startswith("Ray's state API: actor FullyAsyncTrainer")


def test_ray_s_state_api_failing_leaves_the_log_to_classify(db: Database) -> None:
    ray = FakeRay()
    _dead_trainer(ray, "n1", {"oom_context": {"error_message": "killed due to memory pressure"}})
    ray.fail("state", RayUnavailable("the dashboard is restarting"), times=5)
    assert _failed(db, ray, "step:1 - a:1\n" + DIED)["class"] == "actor_died"


# A lost node as the job's driver first sees it: the actor on it cannot be reached.
UNREACHABLE = (
    "ray.exceptions.ActorUnavailableError: The actor 5d1a is unavailable: The actor is "
    "temporarily unavailable: RpcError: RPC error: failed to connect to all addresses; "
    "Failed to connect to remote host: Connection refused rpc_code: 14.\n"
)
OWNER_DIED = {
    "actor_died_error_context": {
        "error_message": "The actor is dead because its owner has died. Owner Ip address: 127.0.0.1"
    }
}


def _ended_on_an_unreachable_actor(db: Database, ray: FakeRay, ago: timedelta) -> Follower:
    add_run(db, "r1", RunStatus.FAILED)
    with db.transaction() as s:
        run = s.get(Run, "r1")
        assert run is not None
        run.ended_at = utcnow() - ago
    ray.set_status("r1", "FAILED", "exit code 1, last logs:\n" + UNREACHABLE, error_type="X")
    ray.log["r1"] = "step:1 - a:1\n" + UNREACHABLE
    _dead_trainer(ray, "n2", OWNER_DIED)
    return Follower(db, ray, "me", 30.0, 100_000, HealthRules(), reader=WholeLogReader(ray))


def test_a_job_ended_on_an_unreachable_actor_waits_for_ray_to_find_its_node_dead(
    db: Database,
) -> None:
    ray = FakeRay()
    follower = _ended_on_an_unreachable_actor(db, ray, timedelta(seconds=5))
    follower.tick()
    assert read_run(db)[0].failure is None  # Ray's health checks have not decided yet
    ray.dead_nodes.append(
        {"node_id": "n2", "node_ip": "127.0.0.1", "state_message": "health check failed"}
    )
    follower.tick()
    failure = read_run(db)[0].failure
    assert failure is not None and failure["class"] == "node_lost", failure
    assert (
        failure["evidence"][0]["line"]
        == "Ray's state API: node 127.0.0.1 died: health check failed"
    )


def test_an_unreachable_actor_whose_node_ray_never_finds_dead_is_an_actor_that_died(
    db: Database,
) -> None:
    ray = FakeRay()
    follower = _ended_on_an_unreachable_actor(db, ray, VERDICT_WAIT + timedelta(seconds=1))
    follower.tick()
    failure = read_run(db)[0].failure
    assert failure is not None and failure["class"] == "actor_died", failure


# The state API gives Ray's enum as its name or its number (3: NODE_DIED).
@pytest.mark.parametrize("reason", ["NODE_DIED", 3])
def test_ray_s_reason_that_the_actor_s_node_died_is_a_lost_node_though_no_node_is_listed(
    db: Database, reason: str | int
) -> None:
    ray = FakeRay()
    context = {"error_message": "The actor died because its node has died.", "reason": reason}
    _dead_trainer(ray, "n1", {"actor_died_error_context": context})
    failure = _failed(db, ray, "step:1 - a:1\n" + DIED)
    assert failure["class"] == "node_lost", failure
    assert "(actor_died_error_context, NODE_DIED)" in failure["evidence"][0]["line"]


def test_on_a_shared_cluster_a_trainer_killed_after_a_forged_oom_line_is_killed_outside(
    db: Database,
) -> None:
    """Another team's job on the run's cluster wrote one "NPU out of memory" line into its log,
    then killed its trainer: Ray records a worker that ended with no error of its own and no
    memory evidence, so the run was killed from outside it, audited."""
    from sqlalchemy import select

    from service.store.models import AuditEntry

    ray = FakeRay()
    why = (
        "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR "
        "Worker exit detail: Worker unexpectedly exits with a connection error code 2."
    )
    ray.dead_actors.append(
        {
            "job_id": "r1",
            "class_name": "TaskRunner",
            "node_id": "n1",
            "pid": 4242,
            "death_cause": {"actor_died_error_context": {"error_message": why, "reason": 1}},
        }
    )
    forged = "(TaskRunner pid=7) torch.OutOfMemoryError: NPU out of memory.\n"
    launch = {"argv": ["true"], "shared_on": ["default"]}
    add_run(db, "r1", RunStatus.FAILED, team="vision", cluster="default", launch=launch)
    with db.transaction() as s:
        run = s.get(Run, "r1")
        assert run is not None
        run.ended_at = run.started_at = (run.started_at or run.created_at) - timedelta(minutes=1)
    ray.set_status("r1", "FAILED", error_type="JOB_FAILED")
    ray.log["r1"] = "step:1 - a:1\n" + forged + DIED
    Follower(db, ray, "me", 30.0, 100_000, HealthRules(), reader=WholeLogReader(ray)).tick()
    failure = read_run(db)[0].failure
    assert failure is not None and failure["class"] == "killed_outside", failure
    assert "(npu_oom)" in failure["summary"]
    with db.read() as s:
        rows = s.scalars(select(AuditEntry).where(AuditEntry.action == "run.killed_outside"))
        assert [(r.run_id, r.target, r.user) for r in rows] == [("r1", "vision", "ray-cluster")]

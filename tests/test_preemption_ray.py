"""Preemption on the real local Ray head with tiny-grpo, two service replicas on one PostgreSQL:
two low runs fill the cluster, a high run that needs all of it is submitted; one decision (not
one per replica) preempts both, each stops right after its next checkpoint (no step lost),
comes back as attempt 2 of the same run, resumes from that checkpoint and succeeds with one
reward history, no step twice. The figures of the same scenario:
tests/benchmarks/bench_preemption.py."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.cluster.local_ray import LocalRayCluster
from service.cluster.ray_jobs import RayJobs
from tests.benchmarks.bench_preemption import scenario, settings_for

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_two_replicas_preempt_once_and_the_victim_resumes_from_its_checkpoint(
    db_url: str, ray_cluster: LocalRayCluster, ray: RayJobs
) -> None:
    settings = settings_for(ray_cluster.address, db_url, 60.0)
    with TestClient(create_app(settings)) as one, TestClient(create_app(settings)):
        out = scenario(one, 40, 3)
    assert out.high["status"] == "SUCCEEDED"
    assert len(out.victims) == 1, out.events  # 8 of 16 NPUs: one victim is enough
    ((victim_id, victim),) = out.victims.items()
    high = out.high["id"]
    asked = [r for r in out.events[victim_id] if r.startswith(f"preempted for run {high} (high)")]
    assert len(asked) == 2, out.events[victim_id]  # the decision, once; the end of attempt 1
    assert asked[0].startswith(
        f"preempted for run {high} (high): asked to stop at its next checkpoint within 60 s"
    )
    assert asked[1].endswith("attempt 2 waits to resume from its checkpoint")
    assert out.lost[victim_id] == 0
    assert victim["status"] == "SUCCEEDED" and victim["attempt"] == 2
    resumed = victim["attempts"][-1]["resumed_from_step"]
    assert resumed is not None and resumed == out.saved_at[victim_id]
    steps = out.steps[victim_id]
    assert steps == sorted(set(steps)) and steps[-1] == 14
    other = next(i for i in out.steps if i != victim_id)
    assert not any(r.startswith("preempted") for r in out.events[other])

"""Preemption on the real local Ray head with tiny-grpo, two service replicas on one PostgreSQL:
two low runs fill the cluster, a high run that needs all of it is submitted; one decision (not
one per replica) preempts both, each stops right after its next checkpoint (no step lost),
comes back as attempt 2 of the same run, resumes from that checkpoint and succeeds with one
reward history, no step twice. The figures of the same scenario:
tests/benchmarks/bench_preemption.py."""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.cluster.local_ray import LocalRayCluster
from service.cluster.ray_jobs import RayJobs
from tests.benchmarks.bench_preemption import (
    TERMINAL,
    high_spec,
    low_spec,
    scenario,
    settings_for,
    wait,
)
from tests.conftest import make_settings

pytestmark = [pytest.mark.ray, pytest.mark.slow]

LOW_VERSIONS = 30  # a low run's versions: well past the high run's arrival, after a slow start


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_two_replicas_preempt_once_and_the_victim_resumes_from_its_checkpoint(
    db_url: str, ray_cluster: LocalRayCluster, ray: RayJobs
) -> None:
    settings = settings_for(ray_cluster.address, db_url, 60.0)
    with TestClient(create_app(settings)) as one, TestClient(create_app(settings)):
        out = scenario(one, LOW_VERSIONS, 2)
    assert out.high["status"] == "SUCCEEDED"
    assert len(out.victims) == 2, out.events  # the high run needs all 16 NPUs
    high = out.high["id"]
    for victim_id, victim in out.victims.items():
        events = out.events[victim_id]
        asked = [r for r in events if r.startswith(f"preempted for run {high} (high)")]
        assert len(asked) == 2, events  # the decision, once (not once per replica); the end
        assert asked[0].startswith(
            f"preempted for run {high} (high): asked to stop at its next checkpoint within 60 s"
        )
        assert asked[1].endswith("attempt 2 waits to resume from its checkpoint")
        assert out.lost[victim_id] == 0
        assert victim["status"] == "SUCCEEDED" and victim["attempt"] == 2
        # From the newest save on disk: the one it stopped at, or one its job wrote while Ray
        # was stopping it.
        resumed = victim["attempts"][-1]["resumed_from_step"]
        saved = out.saved_at[victim_id]
        assert resumed is not None and saved is not None and resumed >= saved
        steps = out.steps[victim_id]
        assert steps == sorted(set(steps)) and steps[-1] == LOW_VERSIONS


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_run_admitted_lately_keeps_running_and_the_high_run_says_why(
    db_url: str, ray_cluster: LocalRayCluster, ray: RayJobs
) -> None:
    settings = make_settings(
        db_url, ray_cluster.address, preemption="on", preemption_min_admitted_s=600.0
    )
    with TestClient(create_app(settings)) as client:
        low = client.post("/runs", json=low_spec("fresh", 200)).json()["id"]
        wait(client, low, lambda r: r["status"] == "RUNNING" and r["checkpoint"], 300)
        high = client.post("/runs", json=high_spec(1)).json()["id"]
        told = wait(client, high, lambda r: "not preempted" in (r["queue_reason"] or ""), 60)
        assert f"not preempted: {low} admitted " in told["queue_reason"], told["queue_reason"]
        assert "(not preempted before 600 s)" in told["queue_reason"]
        time.sleep(1.0)  # rounds after it: still spared
        run = client.get(f"/runs/{low}").json()
        assert run["status"] == "RUNNING" and run["stop"] is None, run["stop"]
        assert not [e for e in run["events"] if e["kind"] == "preempted"], run["events"]
        for run_id in (high, low):
            client.post(f"/runs/{run_id}/cancel")
        for run_id in (high, low):
            wait(client, run_id, lambda r: r["status"] in TERMINAL, 120)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_run_preempted_its_most_times_is_left_alone_and_the_high_run_says_why(
    db_url: str, ray_cluster: LocalRayCluster, ray: RayJobs
) -> None:
    settings = make_settings(
        db_url,
        ray_cluster.address,
        preemption="on",
        preemption_min_admitted_s=0.0,
        preemption_max_times=1,
        preemption_rest_s=600.0,
    )
    with TestClient(create_app(settings)) as client:
        low = client.post("/runs", json=low_spec("often", 200)).json()["id"]
        wait(client, low, lambda r: r["status"] == "RUNNING" and r["checkpoint"], 300)
        first = client.post("/runs", json=high_spec(1)).json()["id"]
        wait(client, first, lambda r: r["status"] in TERMINAL, 300)
        # Preempted once, it resumed; the next high run that needs its room finds it left alone.
        wait(client, low, lambda r: r["status"] == "RUNNING" and r["attempt"] == 2, 300)
        second = client.post("/runs", json=high_spec(1)).json()["id"]
        told = wait(client, second, lambda r: "not preempted" in (r["queue_reason"] or ""), 60)
        assert f"not preempted: {low} preempted 1 times: left alone for " in told["queue_reason"]
        time.sleep(1.0)  # rounds after it: still spared
        run = client.get(f"/runs/{low}").json()
        assert run["status"] == "RUNNING" and run["attempt"] == 2 and run["stop"] is None
        assert len([e for e in run["events"] if e["kind"] == "preempted"]) == 1, run["events"]
        for run_id in (second, low):
            client.post(f"/runs/{run_id}/cancel")
        for run_id in (second, low):
            wait(client, run_id, lambda r: r["status"] in TERMINAL, 120)

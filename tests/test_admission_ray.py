"""Admission against a real local Ray cluster of two nodes x 8 NPUs (tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.cluster.local_ray import LocalRayCluster
from service.cluster.ray_jobs import RayJobs
from tests.conftest import RAY_PORT, TERMINAL, make_settings, submit, wait_for, wait_status

pytestmark = pytest.mark.ray

WHOLE_CLUSTER = [{"role": "trainer", "accelerators": 8, "count": 2}]


def fill_cluster(client: TestClient) -> list[str]:
    """Two long runs of 8 NPUs, one per node, both RUNNING."""
    hogs = [submit(client, npus=8, seconds=120) for _ in range(2)]
    for hog in hogs:
        wait_status(client, hog, {"RUNNING"})
    return hogs


def queue_of(client: TestClient) -> list[str]:
    return [r["id"] for r in client.get("/cluster").json()["queue"]]


def reason_of(client: TestClient, run_id: str) -> str:
    reason: str = wait_for(
        lambda: client.get(f"/runs/{run_id}").json()["queue_reason"], lambda r: r is not None
    )
    return reason


def test_the_sixteen_per_node_shape_is_refused_with_the_two_by_eight_suggestion(
    sqlite_service: Callable[..., TestClient],
) -> None:
    with sqlite_service() as client:
        nodes = client.get("/cluster").json()["nodes"]
        assert sorted(n["total"]["NPU"] for n in nodes) == [8.0, 8.0]
        body = {"recipe": "test-script", "groups": [{"role": "trainer", "accelerators": 16}]}
        refused = client.post("/runs", json=body)
        assert refused.status_code == 422, refused.text
        problem = refused.json()
        assert [e["field"] for e in problem["errors"]] == ["groups[0].accelerators"]
        assert problem["suggestion"] == {"groups[0].count": 2, "groups[0].accelerators": 8}
        dry = client.post("/runs", params={"dry_run": True}, json=body)
        assert dry.status_code == 200 and dry.json()["plan"]["feasible_ever"] is False
        assert dry.json()["plan"]["suggestion"] == problem["suggestion"]
        plan = client.post(
            "/runs",
            params={"dry_run": True},
            json={"recipe": "test-script", "groups": WHOLE_CLUSTER},
        ).json()["plan"]
        assert plan["feasible_ever"] is True and plan["feasible_now"] is True
        trainer_nodes = {s["node"] for s in plan["placement"] if s["role"] == "trainer"}
        assert trainer_nodes == {n["id"] for n in nodes}
        assert plan["queue_position"] == 0 and plan["totals"]["cluster"]["NPU"] == 16.0


@pytest.mark.slow
def test_the_reference_verl_preset_is_refused_on_eight_npu_nodes_with_the_fix(
    tmp_path: Any,
) -> None:
    """The reference run (16 + 16 NPUs) on four 8-NPU nodes: 16 per node can never be placed."""
    cluster = LocalRayCluster(
        [8, 8, 8, 8], cpus_per_node=64, port=RAY_PORT + 200, dashboard_port=RAY_PORT + 2200
    ).start()
    preset = {"recipe": "verl-fully-async", "preset": "geo3k-qwen3vl-8b-npu"}
    settings = make_settings(
        f"sqlite:///{tmp_path}/db.sqlite", cluster.address, ray_token=cluster.token, run_loops=False
    )
    try:
        with TestClient(create_app(settings)) as client:
            refused = client.post("/runs", json=preset)
            assert refused.status_code == 422, refused.text
            problem = refused.json()
            assert [e["field"] for e in problem["errors"]] == ["resources.n_gpus_training"]
            assert problem["suggestion"] == {
                "resources.n_nodes_train": 2,
                "resources.n_gpus_training": 8,
            }
            assert client.get("/runs").json()["items"] == []
            # The suggested shape is accepted as it stands and fits the idle cluster now.
            fixed = {**preset, "resources": {"n_nodes_train": 2, "n_gpus_training": 8}}
            plan = client.post("/runs", params={"dry_run": True}, json=fixed).json()["plan"]
            assert plan["feasible_ever"] is True and plan["feasible_now"] is True
            trainer_nodes = {s["node"] for s in plan["placement"] if s["role"] == "trainer"}
            assert len(trainer_nodes) == 2
    finally:
        cluster.cleanup()
        assert client.get("/runs").json()["items"] == []


# Admission's database part runs on both in the fast layer (test_admission*.py); Ray's, once.
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_two_runs_that_each_need_the_whole_cluster_run_one_after_the_other(
    service_factory: Callable[..., TestClient], db_url: str, ray: RayJobs
) -> None:
    with service_factory(db_url) as client:
        first = submit(client, groups=WHOLE_CLUSTER, seconds=3)
        second = submit(client, groups=WHOLE_CLUSTER, seconds=1)
        wait_status(client, first, {"RUNNING"})
        assert client.get(f"/runs/{second}").json()["status"] == "QUEUED"
        assert reason_of(client, second).startswith("capacity: needs 2 x 8 NPU, each on one node")
        assert wait_status(client, second, TERMINAL)["status"] == "SUCCEEDED"
        assert client.get(f"/runs/{first}").json()["status"] == "SUCCEEDED"
    a, b = ray.get(first), ray.get(second)
    assert a is not None and b is not None and a.end_time_ms and b.start_time_ms
    assert b.start_time_ms >= a.end_time_ms
    assert "placed 2 groups" in (ray.logs(second) or "")


def test_a_high_priority_run_overtakes_queued_runs_but_never_preempts(
    sqlite_service: Callable[..., TestClient],
) -> None:
    with sqlite_service() as client:
        hogs = fill_cluster(client)
        normal = submit(client, npus=8, seconds=1)
        high = submit(client, npus=8, seconds=120, priority="high")
        assert queue_of(client) == [high, normal]
        client.post(f"/runs/{hogs[0]}/cancel")
        wait_status(client, high, {"RUNNING"})
        assert client.get(f"/runs/{normal}").json()["status"] == "QUEUED"
        kept = client.get(f"/runs/{hogs[1]}").json()
        assert kept["status"] == "RUNNING" and kept["stop_requested"] is False


def test_a_team_over_its_quota_waits_while_another_teams_run_starts(
    sqlite_service: Callable[..., TestClient],
) -> None:
    with sqlite_service(team_quotas={"vision": 8}) as client:
        first = submit(client, team="vision", npus=8, seconds=120)
        wait_status(client, first, {"RUNNING"})
        over = submit(client, team="vision", npus=8, seconds=1)
        other = submit(client, team="text", npus=8, seconds=120)
        wait_status(client, other, {"RUNNING"})
        assert client.get(f"/runs/{over}").json()["status"] == "QUEUED"
        assert reason_of(client, over) == (
            "quota: team vision holds 8 of its 8 accelerators; this run needs 8"
        )
        view = client.get("/cluster").json()
        assert view["teams"]["vision"]["accelerators"] == 8
        assert view["teams"]["vision"]["quota"] == 8
        too_big = client.post("/runs", json={"recipe": "test-script", "team": "vision", "npus": 16})
        assert too_big.status_code == 422 and "quota" in too_big.json()["detail"]


def test_cancelling_a_queued_run_frees_its_place_at_once(
    sqlite_service: Callable[..., TestClient],
) -> None:
    with sqlite_service() as client:
        hogs = fill_cluster(client)
        first, second = submit(client, npus=8, seconds=1), submit(client, npus=8, seconds=1)
        assert queue_of(client) == [first, second]
        client.post(f"/runs/{first}/cancel")
        assert queue_of(client) == [second]
        client.post(f"/runs/{hogs[0]}/cancel")
        assert wait_status(client, second, TERMINAL)["status"] == "SUCCEEDED"


def test_a_silent_running_run_is_flagged_stuck_and_stopped_by_policy(
    sqlite_service: Callable[..., TestClient],
) -> None:
    # Silent longer than the log stream's own delay: the job's first line must not arrive after
    # the run was already called stuck (and so clear the flag before the stop lands).
    settings = {"stuck_silent_s": 4.0, "watchdog_interval_s": 0.3, "stop_stuck": True}
    with sqlite_service(**settings) as client:
        run_id = submit(client, seconds=120)
        run = wait_status(client, run_id, TERMINAL)
    assert run["status"] == "STOPPED"
    assert run["health"] == {"status": "stuck", "reason": "no log output for 4 s while RUNNING"}
    reasons = [e["reason"] for e in run["events"]]
    assert "health stuck: no log output for 4 s while RUNNING" in reasons
    assert "stop requested: stuck (no log output for 4 s while RUNNING)" in reasons


def test_a_team_past_its_budget_queues_with_the_reason_until_an_admin_lets_it_through(
    sqlite_service: Callable[..., TestClient],
) -> None:
    # 0.001 NPU-hours (3.6 NPU-seconds): one second on 8 NPUs is past it.
    with sqlite_service(team_budgets={"vision": 0.001}) as client:
        first = submit(client, team="vision", npus=8, seconds=1)
        assert wait_status(client, first, TERMINAL)["status"] == "SUCCEEDED"
        over = submit(client, team="vision", npus=8, seconds=1)
        other = submit(client, team="text", npus=8, seconds=1)
        assert wait_status(client, other, TERMINAL)["status"] == "SUCCEEDED"
        assert client.get(f"/runs/{over}").json()["status"] == "QUEUED"
        reason = reason_of(client, over)
        assert reason.startswith("budget: team vision used 0 of 0.001 NPU-hours"), reason
        assert client.post(f"/runs/{over}/admit-over-budget").status_code == 200
        assert wait_status(client, over, TERMINAL)["status"] == "SUCCEEDED"

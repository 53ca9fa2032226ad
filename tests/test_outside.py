"""What happens on the cluster outside the service, on a real local Ray head: a member's job
that stops another team's run through Ray's Jobs API is seen and recorded; a stop the service
made is not mistaken for one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi.testclient import TestClient

from service.cluster.local_ray import LocalRayCluster
from service.cluster.ray_jobs import RayJobs
from tests.conftest import submit, wait_for, wait_status


def audit_of(client: TestClient, run_id: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = client.get("/audit", params={"run_id": run_id}).json()["items"]
    return rows


def test_a_job_that_stops_another_team_s_run_on_ray_is_recorded_as_a_stop_outside(
    sqlite_service: Callable[..., TestClient], ray_cluster: LocalRayCluster
) -> None:
    with sqlite_service() as client:
        victim = submit(client, team="vision", seconds=120)
        wait_status(client, victim, {"RUNNING"})
        attacker = submit(
            client,
            team="nlp",
            stop_job_url=f"{ray_cluster.address}/api/jobs/{victim}/stop",
        )
        run = wait_status(client, victim, {"STOPPED", "FAILED", "SUCCEEDED", "LOST"}, 90)
        assert wait_status(client, attacker, {"SUCCEEDED", "FAILED"})["status"] == "SUCCEEDED"

        assert run["status"] == "STOPPED" and run["health"]["status"] == "stopped_outside"
        assert run["events"][-2]["reason"].startswith("stopped outside rlrun")
        rows = audit_of(client, victim)
        outside = [r for r in rows if r["action"] == "run.stopped_outside"]
        assert len(outside) == 1
        assert outside[0]["user"] == "ray-cluster" and outside[0]["target"] == "vision"

        cancelled = submit(client, team="vision", seconds=120)
        wait_status(client, cancelled, {"RUNNING"})
        assert client.post(f"/runs/{cancelled}/cancel").status_code == 200
        run = wait_status(client, cancelled, {"STOPPED", "FAILED", "SUCCEEDED", "LOST"}, 90)
        assert run["status"] == "STOPPED" and run["health"]["status"] == "ok"
        assert not any("outside" in e["reason"] for e in run["events"])
        assert [r["action"] for r in audit_of(client, cancelled)] == ["run.cancel", "run.create"]


def test_a_job_sent_straight_to_ray_is_shown_counted_recorded_and_stopped_by_setting(
    sqlite_service: Callable[..., TestClient], ray: RayJobs
) -> None:
    entrypoint = "RAW_TOKEN=hunter2 python3 -c 'import time; time.sleep(300)'"
    assert ray.submit("raw-job-1", entrypoint, {}, {}, entrypoint_resources={"NPU": 4.0})
    with sqlite_service(inventory_ttl_s=0.5) as client:
        view = wait_for(
            lambda: client.get("/cluster").json(),
            lambda v: any(j["id"] == "raw-job-1" and j["resources"] for j in v["unmanaged"]),
        )
        job = next(j for j in view["unmanaged"] if j["id"] == "raw-job-1")
        assert job["type"] == "SUBMISSION" and job["resources"]["NPU"] == 4.0
        assert job["entrypoint"].startswith("RAW_TOKEN=… python3 -c")
        assert "hunter2" not in client.get("/cluster").text
        assert sum(n["NPU"] for n in job["nodes"].values()) == 4.0

        # The whole cluster (16 NPUs) minus 4 outside: the service's own account says so.
        spec = {"recipe": "test-script", "groups": [{"accelerators": 8, "count": 2}]}
        plan = client.post("/runs", params={"dry_run": "true"}, json=spec).json()["plan"]
        assert plan["feasible_now"] is False and plan["feasible_ever"] is True
        assert "jobs outside rlrun hold 4" in plan["reasons"][0]

        wait_for(lambda: actions(client), lambda a: ("job.unmanaged", "raw-job-1") in a)
        assert ray.get("raw-job-1").status == "RUNNING"  # type: ignore[union-attr]

    with sqlite_service(inventory_ttl_s=0.5, stop_unmanaged_after_s=0.0) as client:
        wait_for(lambda: actions(client), lambda a: ("job.stopped_unmanaged", "raw-job-1") in a)
        info = wait_for(lambda: ray.get("raw-job-1"), lambda j: j.status == "STOPPED", 60)
        assert info.status == "STOPPED"
        assert actions(client).count(("job.unmanaged", "raw-job-1")) == 1
        wait_for(lambda: client.get("/cluster").json()["unmanaged"], lambda u: u == [])


def actions(client: TestClient) -> list[tuple[str, str]]:
    # The most a page holds: jobs earlier tests left on the session's cluster (a benchmark's
    # 100 pending ones) are recorded too, and 100 rows can all be theirs.
    rows = client.get("/audit", params={"limit": 500}).json()["items"]
    return [(r["action"], r["target"]) for r in rows]

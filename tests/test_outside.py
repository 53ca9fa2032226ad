"""What happens on the cluster outside the service, on a real local Ray head: a member's job
that stops another team's run through Ray's Jobs API is seen and recorded; a stop the service
made is not mistaken for one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi.testclient import TestClient

from service.cluster.local_ray import LocalRayCluster
from tests.conftest import submit, wait_status


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

"""Runs against a real local Ray head: success, failure, stop, queue, restarts, lost head."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.cluster.ray_jobs import RayJobs
from tests.conftest import TERMINAL, submit, wait_for, wait_status

pytestmark = pytest.mark.ray


def statuses(run: dict[str, Any]) -> list[str]:
    return [e["to_status"] for e in run["events"] if e["from_status"] != e["to_status"]]


def test_a_job_that_succeeds_goes_through_ray_to_succeeded(
    sqlite_service: Callable[..., TestClient], ray: RayJobs
) -> None:
    with sqlite_service() as client:
        run_id = submit(client, name="ok-run", seconds=1)
        run = wait_status(client, run_id, TERMINAL)
    assert run["status"] == "SUCCEEDED", run
    assert statuses(run)[:2] == ["QUEUED", "SUBMITTED"] and statuses(run)[-1] == "SUCCEEDED"
    assert run["ray"]["status"] == "SUCCEEDED" and run["ray"]["exit_code"] == 0
    info = ray.get(run_id)
    assert info is not None and info.status == "SUCCEEDED"
    assert "script run ok-run" in (ray.logs(run_id) or "")


def test_a_job_that_fails_stores_exit_code_and_message(
    sqlite_service: Callable[..., TestClient],
) -> None:
    with sqlite_service() as client:
        run_id = submit(client, exit_code=3, message="reward model exploded")
        run = wait_status(client, run_id, TERMINAL)
    assert run["status"] == "FAILED"
    assert run["ray"]["exit_code"] == 3
    assert run["ray"]["error_type"] == "JOB_ENTRYPOINT_COMMAND_ERROR"
    assert "reward model exploded" in run["ray"]["message"]
    assert "exit code 3" in run["events"][-1]["reason"]


def test_cancelling_a_running_run_stops_it_on_ray(
    sqlite_service: Callable[..., TestClient], ray: RayJobs
) -> None:
    with sqlite_service() as client:
        run_id = submit(client, seconds=120)
        wait_status(client, run_id, {"RUNNING"})
        resp = client.post(f"/runs/{run_id}/cancel")
        assert resp.json()["stop_requested"] is True
        run = wait_status(client, run_id, TERMINAL)
    assert run["status"] == "STOPPED"
    info = ray.get(run_id)
    assert info is not None and info.status == "STOPPED"


def test_a_queued_run_cancelled_never_reaches_ray_and_frees_its_place(
    sqlite_service: Callable[..., TestClient], ray: RayJobs
) -> None:
    with sqlite_service() as client:
        hogs = [submit(client, seconds=120, npus=8) for _ in range(2)]  # the whole cluster
        for hog in hogs:
            wait_status(client, hog, {"RUNNING"})
        waiting = submit(client, seconds=1, npus=8)
        after = submit(client, seconds=1, npus=8)
        assert client.get(f"/runs/{waiting}").json()["status"] == "QUEUED"
        assert client.post(f"/runs/{waiting}/cancel").json()["status"] == "CANCELLED"
        client.post(f"/runs/{hogs[0]}/cancel")
        wait_status(client, hogs[0], TERMINAL)
        assert wait_status(client, after, TERMINAL)["status"] == "SUCCEEDED"
    assert ray.get(waiting) is None


def test_a_run_survives_a_service_restart_and_ray_sees_one_job(
    service_factory: Callable[..., TestClient], db_url: str, ray: RayJobs
) -> None:
    with service_factory(db_url) as client:
        run_id = submit(client, seconds=6)
        wait_status(client, run_id, {"RUNNING"})
    started = ray.get(run_id)
    with service_factory(db_url) as client:
        run = wait_status(client, run_id, TERMINAL)
    assert run["status"] == "SUCCEEDED"
    assert statuses(run).count("SUBMITTED") == 1
    jobs = [j for j in ray.list_jobs() if j.submission_id == run_id]
    assert len(jobs) == 1 and started is not None
    assert jobs[0].start_time_ms == started.start_time_ms


def test_a_name_with_shell_metacharacters_stays_one_argument_on_ray(
    sqlite_service: Callable[..., TestClient], ray: RayJobs
) -> None:
    marker = Path(f"/tmp/pwned-{uuid.uuid4().hex[:8]}")
    name = f"x; touch {marker} $(touch {marker}) `touch {marker}`"
    with sqlite_service() as client:
        run_id = submit(client, name=name)
        run = wait_status(client, run_id, TERMINAL)
    assert run["status"] == "SUCCEEDED"
    assert f"script run {name}" in (ray.logs(run_id) or "")
    assert not marker.exists()


@pytest.mark.slow
def test_runs_wait_queued_while_ray_is_unreachable_and_go_when_it_is_back(
    sqlite_service: Callable[..., TestClient],
) -> None:
    with sqlite_service(ray_address="http://127.0.0.1:9") as client:
        run_id = submit(client)
        ready = client.get("/readyz").json()
        assert ready["ready"] is True and ready["checks"]["ray"]["ok"] is False
        loop = client.app.state.services.loops["submitter"]  # type: ignore[attr-defined]
        wait_for(lambda: loop.failures, lambda n: n >= 2, timeout=30)
        assert client.get(f"/runs/{run_id}").json()["status"] == "QUEUED"
    with sqlite_service() as client:
        assert wait_status(client, run_id, TERMINAL)["status"] == "SUCCEEDED"

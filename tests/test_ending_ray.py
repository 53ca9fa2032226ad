"""A truthful end on the real embedded Ray: a job that exits 0 after 3 of its 30 planned steps
ends FAILED ``ended_early``, naming the step reached, and never shows SUCCEEDED."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient

from service.cluster.ray_jobs import RayJobs
from tests.conftest import TERMINAL, transitions, wait_status

pytestmark = pytest.mark.ray


def _metrics_run(client: TestClient, steps: int, total_steps: int) -> str:
    spec = {"recipe": "test-metrics", "seconds": 60, "every_s": 0.1}
    resp = client.post("/runs", json=spec | {"steps": steps, "total_steps": total_steps})
    assert resp.status_code == 201, resp.text
    run_id: str = resp.json()["id"]
    return run_id


def test_a_job_that_exits_0_after_3_of_30_steps_ends_failed_ended_early(
    sqlite_service: Callable[..., TestClient], ray: RayJobs
) -> None:
    with sqlite_service() as client:
        short = _metrics_run(client, steps=3, total_steps=30)
        whole = _metrics_run(client, steps=3, total_steps=3)
        run = wait_status(client, short, TERMINAL)
        done = wait_status(client, whole, TERMINAL)
    info = ray.get(short)
    assert info is not None and info.status == "SUCCEEDED" and run["ray"]["exit_code"] == 0
    assert run["status"] == "FAILED", run
    assert "SUCCEEDED" not in transitions(run)
    assert run["failure"]["class"] == "ended_early"
    assert run["failure"]["summary"].startswith("trained 3 of 30 steps")
    assert run["progress"]["step"] == 3 and run["progress"]["total_steps"] == 30
    assert done["status"] == "SUCCEEDED" and done["failure"] is None, done

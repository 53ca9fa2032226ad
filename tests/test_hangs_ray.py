"""A hang found in a minute on the real embedded Ray: jobs outside the service hold NPUs on both
nodes after the run's admission, the run's job asks for an actor needing more on one node than
any node has free, and the run's health becomes ``unschedulable``, naming the missing shape."""

from __future__ import annotations

import shlex
import uuid
from collections.abc import Callable
from datetime import datetime

import pytest
from fastapi.testclient import TestClient

from service.cluster.ray_jobs import RayJobs
from tests.conftest import submit, wait_for, wait_status

pytestmark = pytest.mark.ray
SLEEP = shlex.join(["python3", "-c", "import time; time.sleep(300)"])


def test_an_actor_no_node_has_room_for_makes_the_run_unschedulable_within_60_s(
    sqlite_service: Callable[..., TestClient], ray: RayJobs
) -> None:
    tag = uuid.uuid4().hex[:8]
    # One node full, the other with 4 of its 8 NPUs held, by jobs the service never saw.
    for npus in (8.0, 4.0):
        assert ray.submit(f"grab-{npus:g}-{tag}", SLEEP, {}, {}, entrypoint_resources={"NPU": npus})
    wait_for(
        lambda: [ray.get(f"grab-{n}-{tag}") for n in ("8", "4")],
        lambda jobs: all(j is not None and j.status == "RUNNING" for j in jobs),
    )
    with sqlite_service() as client:
        run_id = submit(client, seconds=120, actor_npus=6)
        wait_status(client, run_id, {"RUNNING"})
        run = wait_for(
            lambda: client.get(f"/runs/{run_id}").json(),
            lambda r: r["health"]["status"] == "unschedulable",
            timeout=90,
        )
        client.post(f"/runs/{run_id}/cancel")
        ended = wait_status(client, run_id, {"STOPPED"})
    said = "an actor of this job (Waiting) needs {NPU: 6} on one node; the largest free is 4 NPU"
    assert run["health"]["reason"] == said
    assert run["failure"]["class"] == "unschedulable" and run["failure"]["summary"] == said
    info = ray.get(run_id)
    assert info is not None and info.start_time_ms is not None
    flagged = next(e for e in run["events"] if e["reason"].startswith("health unschedulable"))
    took = datetime.fromisoformat(flagged["at"]).timestamp() - info.start_time_ms / 1000
    print(f"job start -> health unschedulable: {took:.1f} s")
    assert took <= 60
    assert ended["failure"]["class"] == "unschedulable"

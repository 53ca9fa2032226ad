"""Nodes per team on a real local Ray head: one node carries group-a's resource; the mapped
team's job starts there, another team's never does, even with that node's NPUs free."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from tests.conftest import group_a_cluster, submit, wait_for, wait_status

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_a_mapped_team_runs_on_its_node_and_another_team_waits_rather_than_use_it(
    tmp_path: Any,
) -> None:
    with (
        group_a_cluster(tmp_path, 300, [4, 4], "db.sqlite") as (cluster, settings),
        TestClient(create_app(settings)) as client,
    ):
        nodes = client.get("/cluster").json()["nodes"]
        group_a = {n["id"] for n in nodes if n["group"] == "group-a"}
        assert len(group_a) == 1 and len(nodes) == 2

        def driver_node(run_id: str) -> str:
            job = httpx.get(
                f"{cluster.address}/api/jobs/{run_id}", headers=cluster.auth_headers, timeout=10
            ).json()
            return str(job["driver_node_id"])

        vision = submit(client, team="vision", seconds=120, npus=2)
        nlp = submit(client, team="nlp", seconds=120, npus=4)
        wait_status(client, vision, {"RUNNING"})
        wait_status(client, nlp, {"RUNNING"})
        assert driver_node(vision) in group_a and driver_node(nlp) not in group_a

        # group-a's node has 2 NPUs free, but not for nlp: its run waits.
        waiting = submit(client, team="nlp", seconds=1, npus=2)
        run = wait_for(
            lambda: client.get(f"/runs/{waiting}").json(),
            lambda r: r["queue_reason"] is not None,
        )
        assert run["status"] == "QUEUED" and run["queue_reason"].startswith("capacity:")
        for run_id in (vision, nlp, waiting):
            client.post(f"/runs/{run_id}/cancel")

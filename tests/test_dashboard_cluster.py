"""The dashboard's cluster view in a real browser on a live service and a real local Ray head
with a node group: per node its address and who holds what (runs and a job outside rlrun), the
jobs outside rlrun, the team -> node map, and "nothing yet" while a table is empty. Its
screenshot is docs/dashboard-cluster.png."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from service.app import create_app
from service.cluster.ray_jobs import RayJobs
from tests.browser import needs_chromium, shot
from tests.conftest import TERMINAL, group_a_cluster, wait_status
from tests.live import ServerThread

pytestmark = [
    needs_chromium,
    pytest.mark.ray,
    pytest.mark.slow,
]


def test_the_cluster_view_shows_addresses_holders_jobs_outside_and_the_node_map(
    tmp_path: Path,
    page: Any,
) -> None:
    with (
        group_a_cluster(tmp_path, 400, [8, 8], "ui.db") as (cluster, settings),
        ServerThread(create_app(settings)) as url,
        httpx.Client(base_url=url) as http,
    ):
        page.goto(f"{url}/ui/#/cluster")
        page.locator("#nodes tbody tr[data-node]").nth(1).wait_for()
        for table in ("active", "unmanaged", "queue"):
            assert "nothing yet" in page.locator(f"#{table} tbody").inner_text()

        def post(body: dict[str, Any]) -> str:
            resp = http.post("/runs", json={"recipe": "test-script", "seconds": 300} | body)
            assert resp.status_code == 201, resp.text
            run_id: str = resp.json()["id"]
            return run_id

        vision = post({"team": "vision", "name": "vision holder", "npus": 4})
        nlp = post({"team": "nlp", "name": "nlp holder", "groups": [{"accelerators": 2}]})
        for run_id in (vision, nlp):
            wait_status(http, run_id, {"RUNNING"}, timeout=90)
        ray = RayJobs(cluster.address, cluster.token)
        entrypoint = "RAW_TOKEN=hunter2 python3 -c 'import time; time.sleep(300)'"
        ray.submit("raw-job", entrypoint, {}, {}, entrypoint_resources={"NPU": 2.0})
        waiting = post({"team": "nlp", "name": "nlp waits", "npus": 8})

        page.locator("#unmanaged tr[data-id='raw-job']").wait_for(timeout=60_000)
        for holder in (nlp, vision, "raw-job"):
            page.locator(f"#nodes [data-holder='{holder}']").first.wait_for(timeout=60_000)
        page.locator(f"#queue tr[data-id='{waiting}'] .queue-reason").wait_for()
        group_row = page.locator("#nodes tr[data-node]", has_text="group-a")
        assert group_row.locator(f"[data-holder='{vision}']").count() == 1
        assert "vision holder" in group_row.inner_text() and "4 NPU" in group_row.inner_text()
        addresses = page.locator("#nodes .node-address").all_inner_texts()
        assert len(addresses) == 2 and all(a and a != "unknown" for a in addresses)
        raw = page.locator("#unmanaged tr[data-id='raw-job']").inner_text()
        assert "RAW_TOKEN=…" in raw and "hunter2" not in raw and "2 NPU" in raw
        assert "group-a" in page.locator("#team-nodes tr[data-team='vision']").inner_text()
        reason = page.locator(f"#queue tr[data-id='{waiting}'] .queue-reason").inner_text()
        assert reason.startswith("capacity")
        shot(page, "dashboard-cluster.png")
        page.goto("about:blank")  # no more polling of a service about to stop

        ray.stop("raw-job")
        ray.close()
        for run_id in (vision, nlp, waiting):
            http.post(f"/runs/{run_id}/cancel")
        for run_id in (vision, nlp):
            wait_status(http, run_id, TERMINAL, timeout=60)

"""GET /cluster and the dry-run plan while Ray cannot be read: the queue still has an order."""

from __future__ import annotations

from fastapi.testclient import TestClient


def test_cluster_lists_the_queue_in_priority_order_while_ray_is_away(api: TestClient) -> None:
    ids = {}
    for name, priority in [("n1", "normal"), ("l1", "low"), ("h1", "high"), ("n2", "normal")]:
        body = {"recipe": "test-script", "name": name, "priority": priority, "npus": 8}
        ids[name] = api.post("/runs", json=body).json()["id"]
    api.post(f"/runs/{ids['n2']}/cancel")
    view = api.get("/cluster").json()
    assert view["ray"]["ok"] is False and view["nodes"] == []
    assert [r["name"] for r in view["queue"]] == ["h1", "n1", "l1"]
    assert [r["position"] for r in view["queue"]] == [0, 1, 2]
    assert view["queue"][0]["priority"] == "high" and view["queue"][0]["accelerators"] == 8


def test_a_dry_run_without_ray_accepts_the_shape_but_says_it_was_not_checked(
    api: TestClient,
) -> None:
    api.post("/runs", json={"recipe": "test-script", "priority": "high"})
    body = {"recipe": "test-script", "groups": [{"accelerators": 16}]}
    plan = api.post("/runs", params={"dry_run": True}, json=body).json()["plan"]
    assert plan["feasible_ever"] is None and plan["feasible_now"] is False
    assert plan["queue_position"] == 1  # behind the high-priority run
    assert plan["warnings"] == ["the cluster could not be read: feasibility was not checked"]
    assert plan["totals"]["run"]["accelerators"] == 16

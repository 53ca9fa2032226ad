"""Bounded answers: keys per metrics request, rows of the cluster view."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.metrics.parse import MetricLine
from service.metrics.store import add_lines
from service.store.db import Database
from tests.conftest import make_settings


@pytest.fixture
def small(db_url: str) -> Iterator[TestClient]:
    settings = make_settings(
        db_url,
        "http://127.0.0.1:9",
        run_loops=False,
        metric_keys_per_request=2,
        cluster_list_limit=2,
    )
    with TestClient(create_app(settings)) as client:
        yield client


def test_metric_keys_per_request_are_bounded(small: TestClient, db_url: str) -> None:
    run_id = small.post("/runs", json={"recipe": "test-script"}).json()["id"]
    db = Database(db_url)
    with db.transaction() as s:
        add_lines(s, run_id, [(100, MetricLine(1, {"a": 1.0, "b": 2.0, "c": 3.0}))])
    db.dispose()
    refused = small.get(f"/runs/{run_id}/metrics", params={"keys": "a,b,c"})
    assert refused.status_code == 422 and refused.json()["errors"][0]["field"] == "query.keys"
    assert set(small.get(f"/runs/{run_id}/metrics").json()["series"]) == {"a", "b"}


def test_the_cluster_view_is_cut_at_its_bound(small: TestClient) -> None:
    for _ in range(3):
        small.post("/runs", json={"recipe": "test-script"})
    view = small.get("/cluster").json()
    assert len(view["queue"]) == 2 and view["truncated"] is True
    one = small.get("/cluster", params={"limit": 1}).json()
    assert len(one["queue"]) == 1


def test_values_the_database_cannot_hold_are_a_422_not_a_500(small: TestClient) -> None:
    for path in ["/runs/a%00b", "/runs?cursor=a%00b", "/runs?team=a%00", "/runs/a%00/logs"]:
        assert small.get(path).status_code in (404, 200, 422), path
    nul_name = small.post("/runs", json={"recipe": "test-script", "name": "a\u0000b"})
    assert nul_name.status_code in (201, 422), nul_name.text  # 422 on PostgreSQL

"""Bounded answers (keys per metrics request, rows of the cluster view) and bounded storage
(metric keys and points per run)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import cast

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.cluster.ray_jobs import RayJobs
from service.loops.follower import Follower
from service.metrics import store
from service.metrics.health import HealthRules
from service.metrics.log_readers import WholeLogReader
from service.metrics.parse import MetricLine
from service.metrics.store import add_lines
from service.store.db import Database
from service.store.models import RunLog
from tests.conftest import make_settings
from tests.factories import add_run


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


def _line(step: int, *keys: str) -> tuple[int, MetricLine]:
    return step * 10, MetricLine(step, {k: float(step) for k in keys})


def _kept(lines: list[tuple[int, MetricLine]]) -> list[tuple[int, list[str]]]:
    return [(m.step, list(m.values)) for _, m in lines]


def test_past_the_key_limit_only_new_keys_are_dropped() -> None:
    budget = store.Budget(store.Limits(keys=3, points=100), 2, 0, frozenset({"a", "b"}))
    lines = [_line(1, "a", "c", "d", "e"), _line(2, "d", "b", "c"), _line(3, "e")]
    kept, notes = store.within(lines, budget)
    assert _kept(kept) == [(1, ["a", "c"]), (2, ["b", "c"])]
    assert list(notes) == [store.KEYS_FULL]
    assert notes[store.KEYS_FULL].startswith(f"{store.KEYS_FULL} 3 keys (e.g. 'd')")


def test_past_the_point_limit_nothing_more_is_kept() -> None:
    budget = store.Budget(store.Limits(keys=100, points=10), 3, 7, frozenset({"a", "b"}))
    lines = [_line(1, "a", "b"), _line(2, "a", "b", "c"), _line(3, "a")]
    kept, notes = store.within(lines, budget)
    assert _kept(kept) == [(1, ["a", "b"]), (2, ["a"])]
    assert notes == {store.POINTS_FULL: f"{store.POINTS_FULL} 10 points (from step 2)"}


def test_within_the_limits_every_line_is_kept_as_it_is() -> None:
    lines = [_line(1, "a", "b"), _line(2, "a", "c")]
    kept, notes = store.within(lines, store.Budget(store.Limits(3, 4), 0, 0, frozenset()))
    assert kept == lines and notes == {}


class GrowingLog:
    """Ray's answer for a job log that grows between reads (the rest of the follower is real)."""

    def __init__(self) -> None:
        self.text = ""

    def logs(self, _run_id: str) -> str:
        return self.text

    def get(self, _run_id: str) -> None:
        return None  # the job's Ray state is no part of these tests


def _following(db: Database, limits: store.Limits) -> tuple[Follower, GrowingLog]:
    log = GrowingLog()
    ray = cast(RayJobs, log)
    reader = WholeLogReader(ray)
    return Follower(db, ray, "me", 30.0, 10_000, HealthRules(), reader=reader, limits=limits), log


def _followed(db_url: str, limits: store.Limits, *chunks: str) -> tuple[str, RunLog, str]:
    """A run whose log grows by each of ``chunks`` between the follower's reads, and is read
    once more at the end (finding nothing new, it notes nothing twice): the run's id, its
    ``RunLog`` row after, and the whole log."""
    db = Database(db_url)
    run_id = add_run(db, "r-limits")
    follower, log = _following(db, limits)
    for chunk in chunks:
        log.text += chunk
        follower.tick()
    follower.tick()
    with db.transaction() as s:
        runlog = s.get(RunLog, run_id)
        assert runlog is not None
    db.dispose()
    return run_id, runlog, log.text


def _stored(api: TestClient, run_id: str) -> dict[str, list[int]]:
    series = api.get(f"/runs/{run_id}/metrics", params={"max_points": 1000}).json()["series"]
    return {key: [p["step"] for p in points] for key, points in series.items()}


def _notes(api: TestClient, run_id: str, prefix: str) -> list[str]:
    events = api.get(f"/runs/{run_id}").json()["events"]
    return [e["reason"] for e in events if e["reason"].startswith(prefix)]


def test_a_run_past_its_key_limit_keeps_its_keys_growing_and_stores_no_new_one(
    db_url: str, api: TestClient
) -> None:
    # More new keys in one line than one statement may bind.
    garbage = " - ".join(f"g{n}:1.0" for n in range(70_000))
    run_id, runlog, text = _followed(
        db_url,
        store.Limits(keys=3, points=1_000_000),
        "step:1 - a:1.0 - b:1.0\n",
        "step:2 - a:2.0 - c:2.0 - d:2.0 - e:2.0\n",  # c is the third key; d, e are not
        f"step:3 - {garbage} - b:3.0 - c:3.0\nstep:4 - a:4.0\n",
    )
    assert api.get(f"/runs/{run_id}/metrics/keys").json() == ["a", "b", "c"]
    assert _stored(api, run_id) == {"a": [1, 2, 4], "b": [1, 3], "c": [2, 3]}
    assert runlog.metric_keys == 3 and runlog.log_offset == len(text)
    [note] = _notes(api, run_id, store.KEYS_FULL)
    assert "3 keys (e.g. 'd')" in note


def test_a_run_past_its_point_limit_stores_no_more_and_is_still_followed(
    db_url: str, api: TestClient
) -> None:
    run_id, runlog, text = _followed(
        db_url,
        store.Limits(keys=100, points=5),
        "step:1 - a:1.0 - b:1.0\nstep:2 - a:2.0 - b:2.0\nstep:3 - a:3.0 - b:3.0\n",
        "step:4 - a:4.0 - c:4.0\n",
    )
    assert _stored(api, run_id) == {"a": [1, 2, 3], "b": [1, 2]}
    assert runlog.metric_points == 5 and runlog.log_offset == len(text)
    assert runlog.last_step == 4  # progress printed still counts: the run is not stalled
    assert _notes(api, run_id, store.POINTS_FULL) == [f"{store.POINTS_FULL} 5 points (from step 3)"]

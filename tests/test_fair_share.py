"""Fair share with a memory: within a priority class, the team that used less lately goes first."""

from __future__ import annotations

from datetime import timedelta

import pytest
from fastapi.testclient import TestClient

from service import usage
from service.cluster.inventory_cache import InventoryCache
from service.loops.submitter import Submitter
from service.scheduling.admission import QueuedRun, Quotas, fair_order
from service.scheduling.fair_share import decay_over, recent_accelerators
from service.scheduling.shape import Group, ResourceShape
from service.store.db import Database
from service.store.models import Run, utcnow
from service.store.status import RunStatus
from tests.factories import add_run, add_used, read_run
from tests.fake_ray import FakeRay

DAY = 86400.0
EIGHT = ResourceShape(groups=(Group("job", 8, 0.0),), driver_cpus=0.1)


def test_a_team_that_used_the_cluster_lately_waits_behind_one_that_did_not() -> None:
    older, newer = QueuedRun("a1", "a", 1, EIGHT), QueuedRun("b1", "b", 1, EIGHT)
    share = lambda _: 16.0  # noqa: E731
    assert [r.id for r in fair_order([older, newer], {}, Quotas(), share)] == [
        "a1",
        "b1",
    ]
    recent = {"a": 6.0}  # held 6 accelerators on average lately; nothing now
    ordered = fair_order([older, newer], {}, Quotas(), share, recent)
    assert [r.id for r in ordered] == ["b1", "a1"]
    # Another class is not reordered by it: priority first.
    urgent = QueuedRun("a2", "a", 2, EIGHT)
    ordered = fair_order([older, newer, urgent], {}, Quotas(), share, recent)
    assert [r.id for r in ordered] == ["a2", "b1", "a1"]


def test_usage_decays_by_its_half_life() -> None:
    now = 10 * DAY
    # One accelerator-second a half-life ago weighs a half; spread over a day a half-life ago,
    # the mean of the weights over that day.
    assert decay_over(now - DAY, now - DAY, now, DAY) == pytest.approx(0.5)
    assert decay_over(now - DAY, now, now, DAY) == pytest.approx(1 / (2 * 0.6931471805599453))
    # Held steadily for ever: the mean life times the rate; as accelerators, the rate itself.
    forever = 8 * 1000 * DAY * decay_over(now - 1000 * DAY, now, now, DAY)
    assert recent_accelerators({"a": forever}, DAY)["a"] == pytest.approx(8.0)
    assert recent_accelerators({"a": forever}, 0.0) == {}


def test_the_submitter_admits_the_team_with_less_recent_usage_and_says_why(
    api: TestClient, db_url: str
) -> None:
    db = Database(db_url)
    now = utcnow()
    # Team a held 8 accelerators for 12 hours until a day ago.
    add_used(db, "old", "a", 8, now - timedelta(hours=36), now - timedelta(hours=24))
    add_run(db, "a1", RunStatus.QUEUED, team="a", npus=8)
    add_run(db, "b1", RunStatus.QUEUED, team="b", npus=8)
    with db.read() as s:
        decayed = usage.recent(s, now, DAY)
    # 8 x 12 h, about a day old: between a third and a half of it counts.
    assert 8 * 43200 * 0.33 < decayed["a"] < 8 * 43200 * 0.6 and "b" not in decayed
    teams = api.get("/cluster").json()["teams"]
    assert (teams["b"]["turn"], teams["a"]["turn"]) == (1, 2)
    assert teams["a"]["recent"] > 1.0 and teams["b"]["recent"] == 0.0
    ray = FakeRay({"n1": {"NPU": 8.0, "CPU": 8.0}})
    loop = Submitter(db, ray, InventoryCache(ray, 0.0), Quotas(), "me", 30.0, 10, half_life_s=DAY)
    loop.tick()
    assert [s["submission_id"] for s in ray.submitted] == ["b1"]
    waiting, _ = read_run(db, "a1")
    assert waiting.status == RunStatus.QUEUED
    assert waiting.queue_reason is not None
    assert "team a's fair share stands at " in waiting.queue_reason
    assert "(recently 1." in waiting.queue_reason  # about 8 x 12 h / 1.44 days, decayed
    # Now b holds 8 accelerators: what a team holds counts beside what it used.
    teams = api.get("/cluster").json()["teams"]
    assert teams["b"]["accelerators"] == 8 and (teams["a"]["turn"], teams["b"]["turn"]) == (1, 2)
    assert api.get("/runs/a1").json()["queue_reason"] == waiting.queue_reason
    db.dispose()


def test_without_a_memory_the_older_run_goes_first(db: Database) -> None:
    now = utcnow()
    add_used(db, "old", "a", 8, now - timedelta(hours=2), now - timedelta(hours=1))
    add_run(db, "a1", RunStatus.QUEUED, team="a", npus=8)
    add_run(db, "b1", RunStatus.QUEUED, team="b", npus=8)
    ray = FakeRay({"n1": {"NPU": 8.0, "CPU": 8.0}})
    Submitter(db, ray, InventoryCache(ray, 0.0), Quotas(), "me", 30.0, 10).tick()
    assert [s["submission_id"] for s in ray.submitted] == ["a1"]
    with db.read() as s:
        assert s.get(Run, "b1") is not None

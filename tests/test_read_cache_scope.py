"""A kept answer is dropped by a write to what it shows, not by any write: the follower's writes
to one run leave the other runs' answers (and pages that cannot hold that run) served with no
query; a write to a run shows in its next read at once; another process's write is seen within
``read_cache_s``. On SQLite and PostgreSQL."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from service.api.read_cache import Page
from service.app import create_app
from service.loops.follower import Follower
from service.metrics.health import HealthRules
from service.metrics.log_readers import WholeLogReader
from service.store.changes import Changes, RunChange
from service.store.db import Database
from service.store.models import Run
from service.store.status import RunStatus
from tests.conftest import make_settings
from tests.factories import add_run, rename_run, statements
from tests.fake_ray import FakeRay

ROOT = Path(__file__).resolve().parents[1]
# Older than any id the service makes (``r`` + milliseconds in hex): new runs sort above them.
A, B, DONE = "r00a", "r00b", "r00c"


@contextmanager
def service(db_url: str, **settings: Any) -> Iterator[tuple[TestClient, Database]]:
    app = create_app(make_settings(db_url, "http://127.0.0.1:9", run_loops=False, **settings))
    with TestClient(app) as client:
        db: Database = app.state.services.db
        add_run(db, A, RunStatus.RUNNING)
        add_run(db, B, RunStatus.RUNNING)
        add_run(db, DONE, RunStatus.SUCCEEDED, team="other")
        yield client, db


def test_the_followers_writes_to_one_run_leave_the_other_runs_answers_kept(db_url: str) -> None:
    with service(db_url, read_cache_s=60) as (client, db):
        ray = FakeRay()
        follower = Follower(db, ray, "me", 30, 10_000, HealthRules(), reader=WholeLogReader(ray))
        kept = {r: client.get(f"/runs/{r}").json() for r in (A, B, DONE)}
        for step in (1, 2):
            ray.log[A] = "".join(
                f"step:{s} - critic/score/mean:0.{s}\n" for s in range(1, step + 1)
            )
            follower.tick()
        with statements(db, "SELECT") as seen:
            for run_id in (A, B, DONE):
                assert client.get(f"/runs/{run_id}").json() == kept[run_id]
        # A's new metrics too: they change every second and are shown at most 60 s old here.
        assert seen == []
        # A write that changes what A's answer shows (its caller's cancel) is read at once.
        assert client.post(f"/runs/{A}/cancel").json()["stop_requested"] is True
        with statements(db, "SELECT") as seen:
            fresh = client.get(f"/runs/{A}").json()
        assert seen and fresh["stop_requested"] is True
        assert fresh["metrics"]["latest"]["critic/score/mean"] == 0.2
        with statements(db, "SELECT") as seen:
            assert client.get(f"/runs/{B}").json() == kept[B]
        assert seen == []


def test_a_page_that_can_hold_the_run_written_is_read_again_and_no_other(db_url: str) -> None:
    with service(db_url, read_cache_s=60) as (client, db):
        pages = {
            "all": "/runs",
            "team": "/runs?team=t",
            "other team": "/runs?team=other",
            "ended": "/runs?status=SUCCEEDED",
            "older than B": f"/runs?cursor={B}",
        }
        kept = {name: client.get(url).json() for name, url in pages.items()}
        assert [r["id"] for r in kept["older than B"]["items"]] == [A]

        def reread() -> set[str]:
            read_again = set()
            for name, url in pages.items():
                with statements(db, "SELECT") as seen:
                    page = client.get(url).json()
                if seen:
                    read_again.add(name)
                    kept[name] = page
            return read_again

        rename_run(db, B, "renamed")  # shown on the pages that hold B
        assert reread() == {"all", "team"}
        assert kept["team"]["items"][0]["name"] == "renamed"
        # A new run enters the newest pages of its team, not a page of older runs.
        client.post("/runs", json={"recipe": "test-script", "team": "t"})
        assert reread() == {"all", "team"}
        assert len(kept["all"]["items"]) == 4
        # A run that moves into a page's statuses enters it. A status change names no team:
        # a page of another team is read again too (status changes are rare).
        with db.transaction() as s:
            run = s.get(Run, A)
            assert run is not None
            run.status = RunStatus.SUCCEEDED
        assert reread() == {"all", "team", "ended", "older than B", "other team"}
        assert [r["id"] for r in kept["ended"]["items"]] == [DONE, A]
        # Nothing shown changed: no page is read again.
        with db.transaction() as s:
            run = s.get(Run, B)
            assert run is not None
            run.last_output_at = run.created_at
        assert reread() == set()


def test_a_page_with_more_runs_than_it_shows_is_entered_only_by_newer_ones() -> None:
    full = Page(None, None, None, read=frozenset({"r3", "r2"}), oldest="r2")
    moved = RunChange(columns={"status"}, status="QUEUED")
    assert not full.changed_by(Changes({"r1": moved}))  # past the page and the run after it
    assert full.changed_by(Changes({"r4": moved}))
    # Every run that passes the filters was read: any that enters changes the page.
    assert Page(None, None, None, read=frozenset({"r3"})).changed_by(Changes({"r1": moved}))
    # An entering run whose team the write does not name may be of the page's team.
    assert Page(None, "t", None, read=frozenset()).changed_by(Changes({"r1": moved}))
    named = RunChange(inserted=True, status="QUEUED", team="u")
    assert not Page(None, "t", None, read=frozenset()).changed_by(Changes({"r1": named}))


WRITE_ELSEWHERE = """
import sys
from service.store.db import Database
from service.store.models import Run
db = Database(sys.argv[1])
with db.transaction() as s:
    s.get(Run, sys.argv[2]).name = sys.argv[3]
db.dispose()
"""


def test_another_processs_write_is_seen_within_read_cache_s(db_url: str) -> None:
    ttl = 2.0
    with service(db_url, read_cache_s=ttl) as (client, _db):
        assert client.get(f"/runs/{A}").json()["name"] == A
        kept_at = time.monotonic()  # the kept answer was read before this
        write = [sys.executable, "-c", WRITE_ELSEWHERE, db_url, A, "elsewhere"]
        subprocess.run(write, check=True, cwd=ROOT)
        # Polled as a client would: seen once the kept answer is ttl old, never later.
        while client.get(f"/runs/{A}").json()["name"] != "elsewhere":
            assert time.monotonic() - kept_at < ttl + 1.0, "not seen within read_cache_s"
            time.sleep(0.02)

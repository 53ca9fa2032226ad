"""The watchdog's verdicts on one run: stuck before RUNNING, silent while RUNNING, or fine."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select

from service.loops.watchdog import Watchdog
from service.store.db import Database, upgrade
from service.store.models import Run, RunEvent, utcnow
from tests.factories import add_run, new_run

NOW = utcnow()


def run(status: str, **times: object) -> Run:
    return new_run(status=status, ray_status="PENDING", updated_at=NOW, **times)


@pytest.fixture
def watchdog(tmp_path: object) -> Watchdog:
    return Watchdog(
        Database(f"sqlite:///{tmp_path}/unused.db"), submitted_s=600, silent_s=60, stop_stuck=False
    )


def test_a_run_submitted_long_ago_and_not_running_is_stuck(watchdog: Watchdog) -> None:
    late = run("SUBMITTED", submitted_at=NOW - timedelta(seconds=601))
    assert watchdog.stuck_reason(late, NOW) == "not RUNNING 600 s after submission (Ray: PENDING)"
    assert (
        watchdog.stuck_reason(run("SUBMITTED", submitted_at=NOW - timedelta(seconds=5)), NOW)
        is None
    )


def test_a_running_run_without_output_counts_from_its_start(watchdog: Watchdog) -> None:
    silent = run("RUNNING", started_at=NOW - timedelta(seconds=61))
    assert watchdog.stuck_reason(silent, NOW) == "no log output for 60 s while RUNNING"
    talking = run(
        "RUNNING", started_at=NOW - timedelta(hours=1), last_output_at=NOW - timedelta(seconds=3)
    )
    assert watchdog.stuck_reason(talking, NOW) is None
    assert watchdog.stuck_reason(run("SUCCEEDED", started_at=NOW - timedelta(hours=1)), NOW) is None


def test_a_stuck_run_is_flagged_once_and_recovers_when_output_resumes(db_url: str) -> None:
    upgrade(db_url)
    db = Database(db_url)
    woken: list[bool] = []
    dog = Watchdog(
        db, submitted_s=600, silent_s=60, stop_stuck=True, on_stop=lambda: woken.append(True)
    )
    add_run(db, started_at=NOW - timedelta(seconds=120))
    dog.tick()
    dog.tick()
    with db.transaction() as session:
        stored = session.get(Run, "r1")
        assert stored is not None and stored.health == "stuck"
        assert stored.stop_requested_at is not None
        reasons = [e.reason for e in session.scalars(select(RunEvent).order_by(RunEvent.id))]
        stored.last_output_at = utcnow()
    assert reasons == [
        "health stuck: no log output for 60 s while RUNNING",
        "stop requested: stuck (no log output for 60 s while RUNNING)",
    ]
    assert woken == [True]
    dog.tick()
    with db.transaction() as session:
        stored = session.get(Run, "r1")
        assert stored is not None and stored.health == "ok" and stored.health_reason is None
    db.dispose()


def test_a_run_another_check_flagged_is_left_to_that_check(db_url: str) -> None:
    """``stalled`` belongs to the metric checks: a silent stalled run is not also made stuck."""
    upgrade(db_url)
    db = Database(db_url)
    add_run(
        db, started_at=NOW - timedelta(seconds=120), health="stalled", health_reason="no new step"
    )
    Watchdog(db, submitted_s=600, silent_s=60, stop_stuck=True).tick()
    with db.transaction() as session:
        stored = session.get(Run, "r1")
        assert stored is not None and stored.health == "stalled"
        assert stored.stop_requested_at is None
        assert session.scalars(select(RunEvent)).all() == []
    db.dispose()

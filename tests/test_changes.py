"""What a write transaction changed of the runs, read from its statements (ORM flushes and Core
statements alike), on SQLite and PostgreSQL; told after the commit only."""

from __future__ import annotations

import pytest
from sqlalchemy import delete, update

from service.metrics import store
from service.metrics.parse import MetricLine
from service.store.changes import Changes
from service.store.db import Database
from service.store.lifecycle import accept, transition
from service.store.models import Run, RunEvent, RunLog
from service.store.status import RunStatus
from tests.factories import add_run, new_run


@pytest.fixture
def told(db: Database) -> list[Changes]:
    seen: list[Changes] = []
    db.on_commit(seen.append)
    return seen


def test_new_runs_name_their_status_team_and_first_event(db: Database, told: list[Changes]) -> None:
    with db.transaction() as s:  # accepts committed together: one insert of both
        accept(s, [new_run("r1", RunStatus.QUEUED, team="blue"), new_run("r2", RunStatus.QUEUED)])
    assert list(told[-1].runs) == ["r1", "r2"] and not told[-1].everything
    change = told[-1].runs["r1"]
    assert change.inserted and change.events
    assert (change.status, change.team) == ("QUEUED", "blue")
    assert told[-1].runs["r2"].inserted and told[-1].runs["r2"].events


def test_an_orm_status_change_and_core_updates_name_their_run_and_columns(
    db: Database, told: list[Changes]
) -> None:
    add_run(db, "r1", RunStatus.QUEUED)
    add_run(db, "r2", RunStatus.QUEUED)
    with db.transaction() as s:
        run = s.get(Run, "r1")
        assert run is not None
        transition(s, run, RunStatus.SUBMITTED, "submitted")
    change = told[-1].runs["r1"]
    assert change.status == "SUBMITTED" and change.events and "status" in change.columns
    assert list(told[-1].runs) == ["r1"]
    with db.transaction() as s:
        s.execute(
            update(Run).where(Run.id == "r2", Run.status == "QUEUED").values(queue_reason="quota")
        )
        s.execute(update(Run).where(Run.id.in_(["r1", "r2"])).values(ray_message="m"))
    assert told[-1].runs["r2"].columns == {"queue_reason", "ray_message"}
    assert told[-1].runs["r1"].columns == {"ray_message"} and not told[-1].everything


def test_the_followers_columns_and_metric_rows_are_told_apart(
    db: Database, told: list[Changes]
) -> None:
    add_run(db, "r1")
    with db.transaction() as s:
        store.add_lines(s, "r1", [(10, MetricLine(1, {"a": 1.0}))])
        s.add(RunLog(run_id="r1", log_offset=10))
        run = s.get(Run, "r1")
        assert run is not None
        run.last_output_at = run.created_at
    # Metric rows are not watched; the run's own column is, by name.
    assert told[-1].runs["r1"].columns == {"last_output_at"}
    assert not told[-1].runs["r1"].events


def test_a_statement_whose_runs_cannot_be_told_changes_every_run(
    db: Database, told: list[Changes]
) -> None:
    add_run(db, "r1")
    with db.transaction() as s:
        s.execute(update(Run).where(Run.status == "RUNNING").values(health="stuck"))
    assert told[-1].everything
    with db.transaction() as s:
        # An OR is no restriction to the ids it names.
        s.execute(delete(RunEvent).where((RunEvent.run_id == "r1") | (RunEvent.id > 0)))
    assert told[-1].everything


def test_a_write_that_fails_or_changes_no_run_is_not_told(
    db: Database, told: list[Changes]
) -> None:
    add_run(db, "r1")
    before = len(told)
    with pytest.raises(RuntimeError), db.transaction() as s:
        s.execute(update(Run).where(Run.id == "r1").values(name="never"))
        raise RuntimeError("rolled back")
    with db.transaction() as s:
        s.add(RunLog(run_id="r1", log_offset=0))
    assert len(told) == before


def test_a_statement_the_reader_cannot_read_fails_no_write_and_changes_every_run(
    db: Database, told: list[Changes], monkeypatch: pytest.MonkeyPatch
) -> None:
    def unreadable(*_: object) -> None:
        raise KeyError("a shape not foreseen")

    monkeypatch.setattr(Changes, "record", unreadable)
    add_run(db, "r1")
    assert told[-1].everything
    with db.read() as s:
        assert s.get(Run, "r1") is not None

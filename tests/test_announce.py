"""The lifecycle announces a run's changes to the listeners the upper floors registered
(``store/announce.py``, ``service/listeners.py``): the outbox's deliveries commit or roll back
with the change, and a change nobody registered to hear is refused."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from service import listeners
from service.store import announce
from service.store.db import Database
from service.store.lifecycle import transition
from service.store.models import Run, RunEvent, WebhookDelivery
from service.store.status import RunStatus
from tests.factories import add_run, add_webhook


def _counts(db: Database) -> tuple[int, int]:
    with db.read() as s:
        events = s.scalar(select(func.count()).select_from(RunEvent)) or 0
        deliveries = s.scalar(select(func.count()).select_from(WebhookDelivery)) or 0
    return events, deliveries


def test_the_outbox_row_commits_and_rolls_back_with_the_status_change(db: Database) -> None:
    add_webhook(db, ["run.status"], team="t")
    add_run(db, "r1", RunStatus.RUNNING)
    with pytest.raises(ZeroDivisionError), db.transaction() as s:
        run = s.get(Run, "r1")
        assert run is not None
        transition(s, run, RunStatus.SUCCEEDED, "done")
        1 / 0  # noqa: B018  (the caller fails after the change: nothing of it stays)
    assert _counts(db) == (0, 0)
    with db.transaction() as s:
        run = s.get(Run, "r1")
        assert run is not None
        transition(s, run, RunStatus.SUCCEEDED, "done")
    assert _counts(db) == (1, 1)


def test_a_change_nobody_listens_to_is_refused(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(announce, "LISTENERS", announce.Listeners())
    add_run(db, "r1", RunStatus.RUNNING)
    with pytest.raises(RuntimeError, match=r"listeners\.register"), db.transaction() as s:
        run = s.get(Run, "r1")
        assert run is not None
        transition(s, run, RunStatus.SUCCEEDED, "done")
    assert _counts(db) == (0, 0)


def test_registering_twice_registers_once() -> None:
    listeners.register()
    listeners.register()
    assert len(announce.LISTENERS.event) == 1
    assert len(announce.LISTENERS.ended) == 1
    assert len(announce.LISTENERS.ended_off_ray) == 1

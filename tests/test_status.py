"""The run lifecycle: every (from, to) pair, and the transition function's bookkeeping."""

from __future__ import annotations

import itertools

import pytest
from sqlalchemy import select

from service.store.db import Database, upgrade
from service.store.lifecycle import IllegalTransition, transition
from service.store.models import Run, RunEvent, utcnow
from service.store.status import ACTIVE, ENDED, TERMINAL, RunStatus, is_allowed
from tests.factories import new_run

LEGAL = {
    (RunStatus.QUEUED, RunStatus.SUBMITTED),
    (RunStatus.QUEUED, RunStatus.CANCELLED),
    (RunStatus.QUEUED, RunStatus.FAILED),
    *(
        (RunStatus.SUBMITTED, d)
        for d in ("RUNNING", "SUCCEEDED", "FAILED", "STOPPED", "LOST", "RETRYING")
    ),
    *((RunStatus.RUNNING, d) for d in ("SUCCEEDED", "FAILED", "STOPPED", "LOST", "RETRYING")),
    # A failed attempt's run decides: the next attempt, or the attempt's end as the run's.
    *((RunStatus.RETRYING, d) for d in ("QUEUED", "FAILED", "LOST")),
}
PAIRS = list(itertools.product(RunStatus, RunStatus))


@pytest.mark.parametrize(("src", "dst"), PAIRS, ids=[f"{s}->{d}" for s, d in PAIRS])
def test_every_status_pair_is_allowed_exactly_when_the_lifecycle_says(
    src: RunStatus, dst: RunStatus
) -> None:
    assert is_allowed(src, dst) == ((src, RunStatus(dst)) in LEGAL)


def test_terminal_states_are_final_and_active_ones_are_not() -> None:
    for status in TERMINAL:
        assert not any(is_allowed(status, d) for d in RunStatus)
    assert ACTIVE.isdisjoint(TERMINAL)


@pytest.fixture
def database(tmp_path: object) -> Database:
    url = f"sqlite:///{tmp_path}/s.db"
    upgrade(url)
    return Database(url)


@pytest.mark.parametrize(("src", "dst"), sorted(LEGAL), ids=[f"{s}->{d}" for s, d in sorted(LEGAL)])
def test_a_legal_transition_changes_status_stamps_time_and_appends_an_event(
    database: Database, src: RunStatus, dst: str
) -> None:
    with database.transaction() as session:
        # A RETRYING run's attempt ended when it became so.
        run = new_run(status=src, ended_at=utcnow() if src == RunStatus.RETRYING else None)
        session.add(run)
        session.flush()
        transition(session, run, RunStatus(dst), "because")
    with database.transaction() as session:
        run = session.get(Run, "r1")
        assert run is not None and run.status == dst
        events = session.scalars(select(RunEvent)).all()
        assert [(e.from_status, e.to_status, e.reason) for e in events] == [(src, dst, "because")]
        if dst in ENDED:
            assert run.ended_at is not None and run.claim_owner is None
        if dst == RunStatus.SUBMITTED:
            assert run.submitted_at is not None


def test_an_illegal_transition_is_refused_and_writes_nothing(database: Database) -> None:
    with database.transaction() as session:
        session.add(new_run(status=RunStatus.SUCCEEDED))
    with pytest.raises(IllegalTransition), database.transaction() as session:
        run = session.get(Run, "r1")
        assert run is not None
        transition(session, run, RunStatus.RUNNING, "no")
    with database.transaction() as session:
        run = session.get(Run, "r1")
        assert run is not None and run.status == RunStatus.SUCCEEDED
        assert session.scalars(select(RunEvent)).all() == []

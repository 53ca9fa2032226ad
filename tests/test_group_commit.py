"""Group commit: writes that arrive while one commits go out together, each answered as its
own; and accepts stored so on a real database (runs, first events, audit rows, keys, limits)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from sqlalchemy import func, select

from service.errors import TooManyRequests
from service.operations import accept
from service.store.db import Database
from service.store.group_commit import GroupCommit
from service.store.models import AuditEntry, Run, RunEvent
from tests.test_operations import MEMBER, OTHER, Parts, parts  # noqa: F401  (fixture)

WRITERS = 200


def _together(n: int, work: Callable[[int], Any], threads: int = 32) -> list[Any]:
    """``work(i)`` for each i < n, from ``threads`` threads started together; results in order
    (an exception is the result it raised)."""
    go = threading.Barrier(threads)

    def one(i: int) -> Any:
        if i < threads:
            go.wait()
        try:
            return work(i)
        except Exception as exc:
            return exc

    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(one, range(n)))


def test_writes_made_while_one_commits_go_out_together_each_answered_as_its_own() -> None:
    batches: list[list[int]] = []

    def write_all(items: Sequence[int]) -> list[int | BaseException]:
        batches.append(list(items))
        time.sleep(0.005)  # a commit
        return [ValueError(i) if i % 7 == 0 else i * 10 for i in items]

    group: GroupCommit[int, int] = GroupCommit(write_all, max_batch=16)
    answers = _together(WRITERS, group.write)
    for i, answer in enumerate(answers):
        if i % 7 == 0:
            assert isinstance(answer, ValueError) and answer.args == (i,)
        else:
            assert answer == i * 10
    assert sorted(i for b in batches for i in b) == list(range(WRITERS))  # each written once
    assert max(len(b) for b in batches) <= 16
    assert len(batches) < WRITERS / 4, len(batches)  # they did go out together
    assert (group.batches, group.items) == (len(batches), WRITERS)


def test_a_batch_that_fails_as_a_whole_fails_its_writes_and_the_next_ones_still_go() -> None:
    failing = threading.Event()
    failing.set()

    def write_all(items: Sequence[int]) -> list[int | BaseException]:
        time.sleep(0.002)
        if failing.is_set():
            failing.clear()
            raise RuntimeError("the database went away")
        return list(items)

    group: GroupCommit[int, int] = GroupCommit(write_all)
    answers = _together(64, group.write, threads=16)
    failed = [a for a in answers if isinstance(a, RuntimeError)]
    assert 1 <= len(failed) < 64
    assert sorted(a for a in answers if isinstance(a, int)) == sorted(
        i for i, a in enumerate(answers) if not isinstance(a, RuntimeError)
    )
    assert group.write(99) == 99  # the lead was handed on: nothing waits for a dead leader


def _count(db: Database, model: Any) -> int:
    with db.read() as session:
        return int(session.scalar(select(func.count()).select_from(model)) or 0)


def test_concurrent_accepts_are_stored_together_each_with_its_event_and_audit_row(
    parts: Parts,  # noqa: F811
) -> None:
    group = accept.accepts_of(parts.db)
    before = group.batches
    done = _together(WRITERS, lambda i: accept.accept_run(parts, MEMBER, _spec(i), None, "c"))
    assert all(isinstance(d, accept.Accepted) for d in done), [
        d for d in done if not isinstance(d, accept.Accepted)
    ]
    assert len({d.run_id for d in done}) == WRITERS
    assert group.batches - before < WRITERS  # some accepts shared a transaction
    with parts.db.read() as session:
        names = dict(session.execute(select(Run.id, Run.name)).tuples().all())
        events = session.execute(select(RunEvent.id, RunEvent.run_id)).tuples().all()
        audited = Counter(session.scalars(select(AuditEntry.run_id)))
    for i, d in enumerate(done):
        # Each answer is its own run's: its name, and its one event as stored.
        assert names[d.run_id] == d.doc["name"] == f"run-{i}"
        assert [(e["id"], d.run_id) for e in d.doc["events"]] == [
            e for e in events if e[1] == d.run_id
        ]
        assert audited[d.run_id] == 1
    assert len(events) == WRITERS


def test_a_key_taken_in_a_shared_transaction_is_a_replay_and_costs_no_other_run(
    parts: Parts,  # noqa: F811
) -> None:
    # 120 accepts, each key used by three callers at once: one run per key, two replays.
    done = _together(
        120,
        lambda i: accept.accept_run(parts, MEMBER, {"recipe": "test-script"}, f"k{i % 40}", None),
    )
    assert all(isinstance(d, accept.Accepted) for d in done)
    by_key: dict[int, set[str]] = {}
    for i, d in enumerate(done):
        by_key.setdefault(i % 40, set()).add(d.run_id)
    assert all(len(ids) == 1 for ids in by_key.values())
    assert Counter(d.replayed for d in done) == {False: 40, True: 80}
    assert _count(parts.db, Run) == 40


def test_a_team_over_its_limit_is_refused_alone_in_a_shared_transaction(
    parts: Parts,  # noqa: F811
) -> None:
    parts.settings = parts.settings.model_copy(update={"runs_per_team_per_minute": 5, "auth": "on"})
    assert parts.settings.auth_enabled
    done = _together(
        60, lambda i: accept.accept_run(parts, (MEMBER, OTHER)[i % 2], _spec(i), None, None)
    )
    stored = Counter(d.doc["team"] for d in done if isinstance(d, accept.Accepted))
    assert stored == {"vision": 5, "speech": 5}
    assert sum(isinstance(d, TooManyRequests) for d in done) == 50
    assert _count(parts.db, Run) == 10


def _spec(i: int) -> dict[str, Any]:
    return {"recipe": "test-script", "name": f"run-{i}"}


@pytest.fixture(autouse=True)
def _fresh_group() -> None:
    """Each test's database is its own; so is its group."""
    accept._ACCEPTS.clear()

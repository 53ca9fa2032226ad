"""Another replica's write drops this replica's kept answers at once on PostgreSQL (``NOTIFY``),
not when they lapse: two apps on one database, answers kept for a minute."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import ExitStack

import psycopg
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, make_url, text

from service.app import create_app
from service.store.change_feed import (
    CHANNEL,
    MAX_PAYLOAD,
    SEND_EVERY_S,
    ChangeFeed,
    decode,
    payloads,
)
from service.store.changes import Changes, RunChange
from tests.conftest import _truncate as truncate
from tests.conftest import make_settings
from tests.factories import statements
from tests.live import ServerThread, SseClient
from tests.loadgen import SPEC

KEPT_S = 60.0  # far longer than any wait below: only the feed can explain a fresh answer
SEEN_WITHIN_S = 5.0


def test_a_payload_says_each_runs_change_and_many_are_split_to_fit() -> None:
    change = RunChange({"status", "ended_at"}, events=True, status="CANCELLED", team="vision")
    [one] = payloads(Changes(runs={"run_a": change}), "me")
    origin, told = decode(one)
    assert origin == "me" and not told.everything and told.runs == {"run_a": change}
    # An insert is told without its columns (an insert changes them all), unset fields not at all.
    new = RunChange({"id", "status", "team", "spec"}, inserted=True, status="QUEUED", team="t")
    [sent_new] = payloads(Changes(runs={"run_b": new}), "me")
    assert "spec" not in sent_new and "false" not in sent_new
    told_new = RunChange(inserted=True, status="QUEUED", team="t")
    assert decode(sent_new)[1].runs == {"run_b": told_new}
    many = Changes(
        runs={f"run_{i:05d}": RunChange({"status"}, status="RUNNING") for i in range(500)},
        tokens={"tok_1"},
    )
    sent = payloads(many, "me")
    assert len(sent) > 1 and all(len(p.encode()) <= MAX_PAYLOAD for p in sent)
    together = Changes()
    for payload in sent:
        together.then(decode(payload)[1])
    assert together == many
    huge = Changes(runs={"run_a": RunChange({f"c{i}" for i in range(2000)})})
    assert [decode(p)[1].everything for p in payloads(huge, "me")] == [True]
    assert decode("not json")[1].everything
    assert decode('{"o": "x", "r": {"run_a": {"c": 1}}}')[1].everything


def test_changes_of_later_transactions_add_up_and_the_last_status_is_kept() -> None:
    told = Changes(runs={"run_a": RunChange({"status"}, inserted=True, status="QUEUED", team="t")})
    told.then(Changes(runs={"run_a": RunChange({"status"}, status="SUBMITTED")}))
    told.then(Changes(runs={"run_a": RunChange({"health"}), "run_b": RunChange(events=True)}))
    told.then(Changes(tokens={"tok_1"}))
    assert told.runs == {
        "run_a": RunChange({"status", "health"}, inserted=True, status="SUBMITTED", team="t"),
        "run_b": RunChange(events=True),
    }
    assert told.tokens == {"tok_1"}
    told.then(Changes(everything=True))
    told.then(Changes(runs={"run_c": RunChange(events=True)}))
    assert told.everything and not told.runs and not told.tokens


async def _sendings(
    pg_database: str, tell: Callable[[ChangeFeed], Awaitable[None]], listen_s: float
) -> list[str]:
    """The notifications a feed sends while ``tell(feed)`` runs and ``listen_s`` after it."""
    feed = ChangeFeed(pg_database, lambda _change: True)
    conninfo = make_url(pg_database).set(drivername="postgresql").render_as_string(False)
    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
        await conn.execute(f"LISTEN {CHANNEL}")
        sending = asyncio.create_task(feed.send())
        await tell(feed)
        got: list[str] = []
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(listen_s):
                async for note in conn.notifies():
                    got.append(note.payload)
        sending.cancel()
        return got


@pytest.mark.postgres
def test_what_commits_tell_at_once_goes_out_in_one_notification(pg_database: str) -> None:
    async def tell(feed: ChangeFeed) -> None:
        for i in range(50):  # 50 commits told before the sender runs again
            feed.tell(Changes(runs={f"run_{i:02d}": RunChange(events=True)}))

    got = asyncio.run(_sendings(pg_database, tell, 2))
    assert len(got) == 1, got
    assert set(decode(got[0])[1].runs) == {f"run_{i:02d}" for i in range(50)}


@pytest.mark.postgres
def test_commits_told_one_after_another_go_out_a_few_a_second(pg_database: str) -> None:
    """A replica committing all the time sends one notification per ``SEND_EVERY_S`` at most
    (each replica, itself included, receives every one), and each run it told is in one."""
    took = 0.0

    async def tell(feed: ChangeFeed) -> None:
        nonlocal took
        started = time.monotonic()
        for i in range(100):  # a commit every 2 ms or so, for about 0.2 s
            feed.tell(Changes(runs={f"run_{i:02d}": RunChange(events=True)}))
            await asyncio.sleep(0.002)
        took = time.monotonic() - started

    got = asyncio.run(_sendings(pg_database, tell, 1))
    # Sent at once after the sender connects, then once per SEND_EVERY_S at most, and the rest.
    assert got and len(got) <= took / SEND_EVERY_S + 2, (len(got), took)
    told = Changes()
    for payload in got:
        told.then(decode(payload)[1])
    assert set(told.runs) == {f"run_{i:02d}" for i in range(100)}


def _until(check: Callable[[], bool], within_s: float = SEEN_WITHIN_S) -> float:
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < within_s, "not seen in time"
        time.sleep(0.05)
    return time.monotonic() - start


def _terminate(pg_database: str, last_query: str) -> int:
    """End the server processes whose last query is like ``last_query``; how many."""
    admin = create_engine(pg_database, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            return len(
                conn.execute(
                    text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND query LIKE :last"
                    ),
                    {"last": last_query},
                ).all()
            )
    finally:
        admin.dispose()


@pytest.fixture
def replicas(pg_database: str) -> Iterator[list[TestClient]]:
    """Two replicas (apps) on one emptied database, each keeping answers for ``KEPT_S``."""
    truncate(pg_database)
    settings = make_settings(
        pg_database, "http://127.0.0.1:9", run_loops=False, read_cache_s=KEPT_S
    )
    with ExitStack() as stack:
        yield [stack.enter_context(TestClient(create_app(settings))) for _ in range(2)]


@pytest.mark.postgres
def test_another_replicas_write_is_seen_at_once_and_leaves_other_answers_kept(
    replicas: list[TestClient],
) -> None:
    a, b = replicas
    # Each listens from its start: no answer is kept before it would hear of a write.
    assert all(c.app.state.services.feed.listening.is_set() for c in replicas)  # type: ignore[attr-defined]
    changed, untouched = (a.post("/runs", json=SPEC).json()["id"] for _ in range(2))
    # B has been told of the inserts (sent up to SEND_EVERY_S after them): told later, it would
    # drop what it keeps next.
    reads = b.app.state.services.reads  # type: ignore[attr-defined]
    _until(lambda: any(untouched in told.runs for _, told in reads._recent))
    # B keeps both runs and its first page.
    assert b.get(f"/runs/{changed}").json()["status"] == "QUEUED"
    assert b.get(f"/runs/{untouched}").status_code == 200
    assert {r["id"] for r in b.get("/runs?limit=10").json()["items"]} == {changed, untouched}

    assert a.post(f"/runs/{changed}/cancel").json()["status"] == "CANCELLED"
    took = _until(lambda: b.get(f"/runs/{changed}").json()["status"] == "CANCELLED")
    # The other run's answer was not dropped: served without a query.
    with statements(b.app.state.services.db, "SELECT") as queries:  # type: ignore[attr-defined]
        assert b.get(f"/runs/{untouched}").status_code == 200
    assert not queries, queries
    new = a.post("/runs", json=SPEC).json()["id"]
    _until(lambda: new in {r["id"] for r in b.get("/runs?limit=10").json()["items"]})
    print(f"\nanother replica's cancel seen after {took * 1000:.0f} ms")


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("last_query", "connections", "told_first"),
    [
        # Each replica's listener: A's cancel is told by the feed once B listens again, or B's
        # answers are dropped when it reconnects: either way soon.
        pytest.param("LISTEN%", 2, False, id="listener-listens-again-and-drops-what-it-kept"),
        # A's sender (B sent nothing): its sending fails; the sender connects again and tells
        # everything, within its retry.
        pytest.param("SELECT pg_notify%", 1, True, id="lost-write-is-sent-again-as-everything"),
    ],
)
def test_a_replica_whose_feed_lost_its_connection_still_sees_the_others_write_soon(
    replicas: list[TestClient],
    pg_database: str,
    last_query: str,
    connections: int,
    told_first: bool,
) -> None:
    a, b = replicas
    run_id = a.post("/runs", json=SPEC).json()["id"]

    def status() -> str:
        return str(b.get(f"/runs/{run_id}").json()["status"])

    if told_first:  # B has been told of the insert before the connection goes
        _until(lambda: status() == "QUEUED")
    else:
        assert status() == "QUEUED"
    assert _terminate(pg_database, last_query) == connections
    assert a.post(f"/runs/{run_id}/cancel").status_code == 200
    _until(lambda: status() == "CANCELLED", within_s=15)


@pytest.mark.postgres
def test_a_live_stream_gets_another_replicas_status_event_without_waiting_for_its_poll(
    pg_database: str,
) -> None:
    truncate(pg_database)
    # The stream's replica polls for other replicas' writes only every 30 s: the feed wakes it.
    slow_poll = make_settings(pg_database, "http://127.0.0.1:9", run_loops=False, events_poll_s=30)
    with (
        ServerThread(create_app(slow_poll)) as watcher,
        TestClient(create_app(slow_poll)) as writer,
    ):
        run_id = writer.post("/runs", json=SPEC).json()["id"]
        stream = SseClient(run_id, watcher).start()
        try:
            stream.wait(lambda s: s.statuses() == ["QUEUED"], timeout=10)
            cancelled_at = time.monotonic()
            assert writer.post(f"/runs/{run_id}/cancel").status_code == 200
            stream.wait(lambda s: "CANCELLED" in s.statuses(), timeout=SEEN_WITHIN_S)
            took = time.monotonic() - cancelled_at
        finally:
            stream.ended.set()
    print(f"\nanother replica's cancel streamed after {took * 1000:.0f} ms")

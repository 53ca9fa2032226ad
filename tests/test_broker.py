"""The event broker without HTTP: replay, live delivery on notify, resume by cursor, the end."""

from __future__ import annotations

import asyncio

import pytest

from service.metrics import store
from service.metrics.broker import Broker, Cursor, Item, read_after
from service.metrics.parse import MetricLine
from service.store.db import Database
from service.store.lifecycle import note, transition
from service.store.models import Run, RunLog, utcnow
from service.store.status import RunStatus
from tests.factories import add_run


def write(db: Database, run_id: str, offset: int, step: int, end: bool = False) -> None:
    """One metric line ending at ``offset``; with ``end`` the run succeeds and its log is read."""
    with db.transaction() as s:
        store.add_lines(s, run_id, [(offset, MetricLine(step, {"a": float(step)}))])
        if end:
            run = s.get(Run, run_id)
            assert run is not None
            transition(s, run, RunStatus.SUCCEEDED, "done")
            s.add(RunLog(run_id=run_id, log_offset=offset, finished_at=utcnow()))


async def collect(broker: Broker, run_id: str, cursor: Cursor) -> list[tuple[Item, Cursor]]:
    return [pair async for pair in broker.subscribe(run_id, cursor)]


def test_a_subscriber_gets_the_stored_items_then_live_ones_then_the_end(db: Database) -> None:
    run_id = add_run(db)
    with db.transaction() as s:
        run = s.get(Run, run_id)
        assert run is not None
        note(s, run, "started")
    write(db, run_id, 10, 1)
    broker = Broker(db, poll_s=30.0)  # only a notify can wake it in time

    async def scenario() -> list[tuple[Item, Cursor]]:
        task = asyncio.create_task(collect(broker, run_id, Cursor()))
        while broker.upstreams == 0:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)
        await asyncio.to_thread(write, db, run_id, 20, 2, True)
        broker.notify(run_id)
        return await asyncio.wait_for(task, 10)

    got = asyncio.run(scenario())
    kinds = [(item.kind, item.data.get("step") or item.data.get("reason")) for item, _ in got]
    assert kinds == [
        ("status", "started"),
        ("metrics", 1),
        ("status", "done"),
        ("metrics", 2),
        ("end", None),
    ]
    assert broker.upstreams == 0
    # Resuming from the cursor after the first metric line replays only what came later.
    after_first = got[1][1]
    resumed = asyncio.run(collect(Broker(db, 30.0), run_id, after_first))
    assert [i.kind for i, _ in resumed] == ["status", "metrics", "end"]
    assert resumed[-1][1] == Cursor(got[2][0].position, 20)


def test_the_poller_wakes_a_stream_for_what_it_has_not_read_and_not_again(db: Database) -> None:
    """Another replica's write (no notify here) reaches the stream within a poll; a poll that
    finds nothing the stream has not read costs it no read."""
    run_id = add_run(db)
    write(db, run_id, 10, 1)
    broker = Broker(db, poll_s=0.05)
    reads: list[Cursor] = []
    plain_read = broker._read

    def counted(run: str, cursor: Cursor) -> object:
        reads.append(cursor)
        return plain_read(run, cursor)

    broker._read = counted  # type: ignore[method-assign,assignment]

    async def scenario() -> list[tuple[Item, Cursor]]:
        task = asyncio.create_task(collect(broker, run_id, Cursor()))
        while broker.upstreams == 0:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.5)  # ten polls of a run whose stream holds all there is
        idle_reads = len(reads)
        await asyncio.to_thread(write, db, run_id, 20, 2)
        await asyncio.sleep(0.5)
        assert len(reads) == idle_reads + 1  # woken once for the new line, then not again
        await asyncio.to_thread(write, db, run_id, 30, 3, True)
        got = await asyncio.wait_for(task, 10)
        assert idle_reads <= 2  # the first read, and one for a poll under way at the start
        return got

    got = asyncio.run(scenario())
    assert [item.data.get("step") for item, _ in got if item.kind == "metrics"] == [1, 2, 3]
    assert got[-1][0].kind == "end"


def test_a_read_is_bounded_and_a_stream_replays_past_the_bound_in_order(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read takes at most ``LINES_LIMIT`` points, never half a line, and says more is stored;
    a stream reads on until it has every line, then the end."""
    run_id = add_run(db)
    keys = [f"k/{i}" for i in range(10)]
    with db.transaction() as s:
        lines = [(10 * n, MetricLine(n, dict.fromkeys(keys, n / 7))) for n in range(1, 11)]
        store.add_lines(s, run_id, lines)
    monkeypatch.setattr(store, "LINES_LIMIT", 25)  # two lines and half the third
    with db.read_rows() as conn:
        first = read_after(conn, run_id, Cursor())
    assert [(i.position, i.data["step"]) for i in first.items] == [(10, 1), (20, 2)]
    assert first.items[0].data["values"] == dict.fromkeys(keys, 1 / 7)
    assert first.more and not first.ended
    write(db, run_id, 110, 11, end=True)
    got = asyncio.run(collect(Broker(db, 30.0), run_id, Cursor()))
    assert [i.data["step"] for i, _ in got if i.kind == "metrics"] == list(range(1, 12))
    assert [i.data["reason"] for i, _ in got if i.kind == "status"] == ["done"]
    assert got[-1][0].kind == "end"
    with db.read_rows() as conn:
        last = read_after(conn, run_id, got[-2][1])
    assert last.items == [] and not last.more and last.ended and last.complete

"""The live stream's upstream fails: its subscribers are told and closed, and resume exactly."""

from __future__ import annotations

import asyncio

from sqlalchemy.exc import OperationalError

from service.metrics import store
from service.metrics.broker import Broker, Cursor, Item
from service.metrics.parse import MetricLine
from service.store.db import Database, upgrade
from service.store.models import Run, RunLog, utcnow
from service.store.status import RunStatus
from tests.factories import add_run


class FlakyBroker(Broker):
    """The real broker on a real database, whose reads fail while ``down`` is set."""

    down = False

    def _read(self, run_id: str, cursor: Cursor) -> object:  # type: ignore[override]
        if self.down:
            raise OperationalError("SELECT ...", {}, ConnectionRefusedError("database is away"))
        return super()._read(run_id, cursor)


def add_steps(db: Database, run_id: str, steps: range) -> None:
    with db.transaction() as s:
        store.add_lines(s, run_id, [(100 * n, MetricLine(n, {"k": float(n)})) for n in steps])


async def consume(broker: Broker, run_id: str, cursor: Cursor, out: list[Item]) -> Cursor:
    """Read one connection's items until the stream closes; the cursor a client would keep."""
    async for item, position in broker.subscribe(run_id, cursor):
        out.append(item)
        cursor = position
    return cursor


async def scenario(db: Database) -> list[list[Item]]:
    broker = FlakyBroker(db, poll_s=0.05)
    run_id = add_run(db, "r-stream")
    add_steps(db, run_id, range(1, 4))
    seen: list[list[Item]] = [[], []]
    first = [asyncio.create_task(consume(broker, run_id, Cursor(), out)) for out in seen]
    while not all(len(out) == 3 for out in seen):
        await asyncio.sleep(0.02)
    broker.down = True
    add_steps(db, run_id, range(4, 6))  # written while the stream cannot read
    broker.notify(run_id)
    cursors = await asyncio.wait_for(asyncio.gather(*first), 10)
    assert all(out[-1].kind == "reconnect" for out in seen)
    assert broker.upstreams == 0  # the dead topic is gone: a new client gets a fresh upstream
    broker.down = False
    add_steps(db, run_id, range(6, 7))
    second = [
        asyncio.create_task(consume(broker, run_id, c, out))
        for c, out in zip(cursors, seen, strict=True)
    ]
    await asyncio.sleep(0.2)
    with db.transaction() as s:
        run = s.get(Run, run_id)
        assert run is not None
        run.status = RunStatus.SUCCEEDED
        s.add(RunLog(run_id=run_id, log_offset=700, finished_at=utcnow()))
    broker.notify(run_id)
    await asyncio.wait_for(asyncio.gather(*second), 10)
    await broker.close()
    return seen


def test_a_failed_upstream_closes_every_stream_and_a_resume_has_no_gap_or_duplicate(
    db_url: str,
) -> None:
    upgrade(db_url)
    db = Database(db_url)
    try:
        seen = asyncio.run(scenario(db))
    finally:
        db.dispose()
    for out in seen:
        steps = [i.data["step"] for i in out if i.kind == "metrics"]
        assert steps == [1, 2, 3, 4, 5, 6]
        assert [i.kind for i in out].count("reconnect") == 1
        assert out[-1].kind == "end"

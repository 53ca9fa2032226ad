"""The in-process broker: one upstream per run, fanned out to any number of live subscribers.

The upstream reads the database (status events past an event id, metric lines past a log
offset), so it sees what any replica's follower or reconciler wrote; the local follower wakes it
at once after each commit. For the writes of other replicas one poller serves every topic: each
``poll_s`` it reads where all of them stand in one query and wakes only those that moved, so an
idle stream costs no read of its own however many are open; on PostgreSQL a status event of
another replica wakes its streams at once (``changed``, told by the change feed). A
subscriber's position is a ``Cursor`` of both: the SSE event id ``"<event id>-<log offset>"``,
so resuming with ``Last-Event-ID`` is exact for both kinds.

When the upstream's read fails (the database is away), the topic is dropped and every subscriber
gets a ``reconnect`` item and its stream closes; a client that reconnects with ``Last-Event-ID``
gets a fresh upstream and resumes exactly where it was.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal

from sqlalchemy import bindparam, func, select
from sqlalchemy.orm import Session

from service.metrics import logcopy, store
from service.store.changes import Changes
from service.store.db import Database
from service.store.models import MetricPoint, Run, RunEvent, RunLog
from service.store.prepared import Prepared, RowsConnection, fetch
from service.store.runs import EVENT_COLUMNS
from service.wire.runs import event_doc

log = logging.getLogger(__name__)
_INT64_MAX = 2**63 - 1
_RECONNECT = "the live stream failed; reconnect with Last-Event-ID to resume"


@dataclass(frozen=True, order=True)
class Cursor:
    event_id: int = 0
    offset: int = 0

    def encode(self) -> str:
        return f"{self.event_id}-{self.offset}"

    @classmethod
    def parse(cls, text: str | None) -> Cursor:
        """A Last-Event-ID; anything unreadable means the start."""
        try:
            event_id, offset = (int(p) for p in (text or "").split("-"))
        except ValueError:
            return cls()
        # Bounded as the columns compared with them (BIGINT): a larger number is no position.
        if not (0 <= event_id <= _INT64_MAX and 0 <= offset <= _INT64_MAX):
            return cls()
        return cls(event_id, offset)


@dataclass(frozen=True)
class Item:
    kind: Literal["status", "metrics", "end", "reconnect"]
    position: int  # the event id (status) or the line's end offset (metrics)
    data: dict[str, Any]

    def after(self, cursor: Cursor) -> bool:
        if self.kind == "status":
            return self.position > cursor.event_id
        if self.kind == "metrics":
            return self.position > cursor.offset
        return True

    def advance(self, cursor: Cursor) -> Cursor:
        if self.kind == "status":
            return Cursor(self.position, cursor.offset)
        if self.kind == "metrics":
            return Cursor(cursor.event_id, self.position)
        return cursor


@dataclass(frozen=True)
class Read:
    items: list[Item]
    more: bool  # more metric lines are stored past the last item (reads are bounded)
    ended: bool  # the run has ended and its log is read to the end (checked before the items)

    @property
    def complete(self) -> bool:
        return self.ended and not self.more


# A stream's read, each statement prebuilt and run on the driver's cursor (``prepared``): a
# woken stream reads a line or two, and SQLAlchemy's execution and ORM rows cost more than that.
_ENDED = Prepared(logcopy.ENDED)
_EVENTS_AFTER = Prepared(
    select(*EVENT_COLUMNS)
    .where(RunEvent.run_id == bindparam("run_id"), RunEvent.id > bindparam("event_id"))
    .order_by(RunEvent.id)
)
_LINES_AFTER = Prepared(store.LINES_AFTER)
_NEWEST_LINE = Prepared(
    select(func.max(MetricPoint.log_offset).label("offset")).where(
        MetricPoint.run_id == bindparam("run_id")
    )
)


def read_after(conn: RowsConnection, run_id: str, cursor: Cursor) -> Read:
    """Items past ``cursor``, in commit order per kind (a run that does not exist is an
    error)."""
    run = {"run_id": run_id}
    (ended_row,) = fetch(conn, _ENDED, run)
    ended = logcopy.read_to_end(*ended_row)
    events = fetch(conn, _EVENTS_AFTER, run | {"event_id": cursor.event_id})
    items = [Item("status", e.id, event_doc(e)) for e in events]
    limit = store.LINES_LIMIT
    rows = fetch(conn, _LINES_AFTER, run | {"offset": cursor.offset, "limit": limit})
    lines = store.as_lines(rows, limit)
    items += [Item("metrics", off, {"step": step, "values": vals}) for off, step, vals in lines]
    last = lines[-1][0] if lines else cursor.offset
    (newest,) = fetch(conn, _NEWEST_LINE, run)
    return Read(items, newest.offset is not None and newest.offset > last, ended)


def standings(session: Session, run_ids: list[str]) -> dict[str, Cursor | None]:
    """Where each run's stream stands: the cursor past its newest event and metric line, or
    None once its log is read to the end (the stream's last item is due)."""
    newest_event = select(func.max(RunEvent.id)).where(RunEvent.run_id == Run.id).scalar_subquery()
    newest_line = (
        select(func.max(MetricPoint.log_offset))
        .where(MetricPoint.run_id == Run.id)
        .scalar_subquery()
    )
    rows = session.execute(
        select(Run.id, newest_event, newest_line, RunLog.finished_at)
        .outerjoin(RunLog, RunLog.run_id == Run.id)
        .where(Run.id.in_(run_ids))
    ).all()
    return {
        run_id: None if finished is not None else Cursor(event or 0, line or 0)
        for run_id, event, line, finished in rows
    }


def _unread(stand: Cursor | None, cursor: Cursor) -> bool:
    """Whether a stream at ``cursor`` has more to read where its run stands (None: the run's
    log is read to the end, or the run is gone; its read tells which)."""
    return stand is None or stand.event_id > cursor.event_id or stand.offset > cursor.offset


def head(session: Session, run_id: str) -> Cursor:
    event_id = session.scalar(select(func.max(RunEvent.id)).where(RunEvent.run_id == run_id))
    offset = session.scalar(
        select(func.max(MetricPoint.log_offset)).where(MetricPoint.run_id == run_id)
    )
    return Cursor(event_id or 0, offset or 0)


# Put in a subscriber's queue when the server shuts down: the stream ends without ``end`` (the
# run has not ended), and the client resumes elsewhere with Last-Event-ID.
_CLOSED = Item("end", -1, {})


@dataclass
class _Topic:
    cursor: Cursor = field(default_factory=Cursor)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    queues: set[asyncio.Queue[Item]] = field(default_factory=set)
    task: asyncio.Task[None] | None = None
    failed: Item | None = None  # set when the upstream's read failed: the topic is dead


class Broker:
    def __init__(self, db: Database, poll_s: float) -> None:
        self.db = db
        self.poll_s = poll_s
        self._topics: dict[str, _Topic] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing = False
        self._poller: asyncio.Task[None] | None = None

    @property
    def upstreams(self) -> int:
        return len(self._topics)

    def notify(self, run_id: str) -> None:
        """New data for ``run_id`` was committed; safe to call from any thread."""
        topic = self._topics.get(run_id)
        if topic is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(topic.wake.set)

    def changed(self, changes: Changes) -> None:
        """Another replica committed ``changes`` (``ChangeFeed``): wake the streams of the runs
        that got events at once, rather than at the next poll."""
        for run_id in list(self._topics) if changes.everything else changes.runs:
            if changes.of_events(run_id):
                self.notify(run_id)

    def close_streams(self) -> None:
        """The server is shutting down: end every live stream now, and any opened later."""
        self._closing = True
        for topic in self._topics.values():
            for queue in topic.queues:
                queue.put_nowait(_CLOSED)

    def _read(self, run_id: str, cursor: Cursor) -> Read:
        with self.db.read_rows() as conn:
            return read_after(conn, run_id, cursor)

    def head_of(self, run_id: str) -> Cursor:
        """Where the run's stream is now (blocking: call it from a thread)."""
        with self.db.read() as session:
            return head(session, run_id)

    async def subscribe(self, run_id: str, cursor: Cursor) -> AsyncIterator[tuple[Item, Cursor]]:
        """Items past ``cursor``: first the stored ones, then live ones; last an ``end`` item once
        the run has ended and its log has been read to the end."""
        if self._closing:
            return
        self._loop = asyncio.get_running_loop()
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll())
        queue: asyncio.Queue[Item] = asyncio.Queue()
        topic = self._topics.get(run_id)
        if topic is None:
            topic = self._topics[run_id] = _Topic()
            topic.task = asyncio.create_task(self._upstream(run_id, topic))
        topic.queues.add(queue)
        try:
            # Once the upstream has its starting point, it delivers everything after it: the
            # replay below then overlaps the queue rather than leaving a hole.
            await topic.ready.wait()
            if topic.failed is not None:
                yield topic.failed, cursor
                return
            while True:
                try:
                    read = await asyncio.to_thread(self._read, run_id, cursor)
                except Exception as exc:
                    log.warning("live stream of run %s: replay failed (%r)", run_id, exc)
                    yield Item("reconnect", 0, {"detail": _RECONNECT}), cursor
                    return
                for item in read.items:
                    if item.after(cursor):
                        cursor = item.advance(cursor)
                        yield item, cursor
                if not read.more:
                    break
            complete = read.complete
            while not complete:
                item = await queue.get()
                if item is _CLOSED:
                    return
                if item.kind == "reconnect":
                    yield item, cursor
                    return
                complete = item.kind == "end"
                if not complete and item.after(cursor):
                    cursor = item.advance(cursor)
                    yield item, cursor
            yield Item("end", 0, {}), cursor
        finally:
            topic.queues.discard(queue)
            if not topic.queues and self._topics.get(run_id) is topic:
                del self._topics[run_id]
                if topic.task is not None:
                    topic.task.cancel()

    async def _upstream(self, run_id: str, topic: _Topic) -> None:
        try:
            await self._follow(run_id, topic)
        except Exception as exc:
            log.warning("live stream of run %s: reading failed (%r); closing it", run_id, exc)
            topic.failed = Item("reconnect", 0, {"detail": _RECONNECT})
            if self._topics.get(run_id) is topic:
                del self._topics[run_id]
            for queue in topic.queues:
                queue.put_nowait(topic.failed)
            topic.ready.set()

    async def _follow(self, run_id: str, topic: _Topic) -> None:
        topic.cursor = await asyncio.to_thread(self.head_of, run_id)
        topic.ready.set()
        while True:
            topic.wake.clear()
            read = await asyncio.to_thread(self._read, run_id, topic.cursor)
            for item in read.items:
                topic.cursor = item.advance(topic.cursor)
                for queue in topic.queues:
                    queue.put_nowait(item)
            if read.complete:
                if self._topics.get(run_id) is topic:
                    del self._topics[run_id]
                for queue in topic.queues:
                    queue.put_nowait(Item("end", 0, {}))
                return
            if not read.more:
                await topic.wake.wait()

    # Runs per query of the poller.
    POLL_BATCH = 500

    def _standings(self, run_ids: list[str]) -> dict[str, Cursor | None]:
        with self.db.read() as session:
            out: dict[str, Cursor | None] = {}
            for n in range(0, len(run_ids), self.POLL_BATCH):
                out |= standings(session, run_ids[n : n + self.POLL_BATCH])
            return out

    async def _poll(self) -> None:
        """Every ``poll_s``: wake the topics whose run holds what they have not read (another
        replica wrote it); not those that read it already, woken by this replica's writer."""
        while True:
            await asyncio.sleep(self.poll_s)
            topics = dict(self._topics)
            if not topics:
                continue
            try:
                now = await asyncio.to_thread(self._standings, list(topics))
            except Exception as exc:
                # Every upstream reads on its own, and a failed read closes its streams.
                log.warning("live streams: polling failed (%r)", exc)
                now = {}
            for run_id, topic in topics.items():
                if _unread(now.get(run_id), topic.cursor):
                    topic.wake.set()

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)
            self._poller = None
        tasks = [t.task for t in self._topics.values() if t.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._topics.clear()

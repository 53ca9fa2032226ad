"""What a write changed of the runs, told to the other replicas by PostgreSQL's ``NOTIFY``: a
replica drops the answers it keeps (``service/api/read_cache.py``) and forgets the tokens it
keeps signed in that were revoked (``service/api/token_cache.py``) when another replica's write
commits, usually within milliseconds, rather than when they lapse. ``read_cache_s`` stays the
bound: a notification can be lost (with its sender's or listener's connection, or a replica
killed between a commit and its sending), and a listener that connects again drops everything
it keeps, since it may have missed some.

A replica tells after its commits (``tell``, on the committing thread) and sends on the event
loop (``send``): what commits told while a notification was on its way, or within
``SEND_EVERY_S`` of the last, goes out together in the next, on a connection of its own. So a
write pays no round trip for the feed, commits do not queue on PostgreSQL's notification lock
one by one, and a replica busy writing sends (and every replica, itself included, receives) a
few dozen notifications a second, not one per commit; a replica that reads on being told sees
the write, sent after its commit. A process without the loop (the CLI's revocation) tells in the
write's own transaction (``publish``): sent if and only if it commits. Each replica ignores its
own notifications (it dropped them at its commit already), by their first bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from sqlalchemy import func, select
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from service.store.changes import Changes, RunChange

log = logging.getLogger(__name__)
CHANNEL = "rlrun_run_changes"
# PostgreSQL refuses a payload of 8,000 bytes or more: a bigger change is told as "everything".
MAX_PAYLOAD = 7_900
# Between a lost connection and the next attempt (doubling up to the last).
RETRY_S = (0.5, 1.0, 2.0, 5.0, 10.0)
# Every notification of one sending in one statement; the payloads as a binary array (the text
# form escapes every quote of the JSON, which cost as much as the round trip).
SEND = "SELECT pg_notify(%s, payload) FROM unnest(%b::text[]) AS payload"
# At most one sending per this long: what commits tell meanwhile goes out together. A sparse
# write is sent at once; under many commits a second it is seen elsewhere this much later.
SEND_EVERY_S = 0.02
# Runs told and not yet sent past which they are sent as everything.
MAX_UNSENT_RUNS = 10_000


def payloads(changes: Changes, origin: str) -> list[str]:
    """The notifications that tell ``changes``: who wrote, each run's change and the tokens
    revoked, split into as many as PostgreSQL's payload limit needs (a run's change alone too
    big for one: everything)."""
    if not changes.everything:
        doc: dict[str, Any] = {
            "o": origin,
            "r": {run_id: _doc(c) for run_id, c in changes.runs.items()},
        }
        if changes.tokens:
            doc["k"] = sorted(changes.tokens)
        text = _dumps(doc)
        if len(text.encode()) <= MAX_PAYLOAD:
            return [text]
        if len(changes.runs) > 1:
            ids = list(changes.runs)
            half = len(ids) // 2
            first = Changes({i: changes.runs[i] for i in ids[:half]}, tokens=changes.tokens)
            rest = Changes({i: changes.runs[i] for i in ids[half:]})
            return payloads(first, origin) + payloads(rest, origin)
    return [_dumps({"o": origin, "e": True})]


def _dumps(doc: dict[str, Any]) -> str:
    # The origin first, compact: a replica knows its own notifications by their first bytes.
    return json.dumps(doc, separators=(",", ":"))


def decode(payload: str) -> tuple[str, Changes]:
    """Who wrote and what changed; a payload that cannot be read counts as everything."""
    try:
        doc = json.loads(payload)
        runs = {str(run_id): _change(c) for run_id, c in doc.get("r", {}).items()}
        tokens = {str(token_id) for token_id in doc.get("k", [])}
        return str(doc["o"]), Changes(runs=runs, everything=bool(doc.get("e")), tokens=tokens)
    except (ValueError, TypeError, KeyError, AttributeError):
        log.warning("a change notification could not be read: every kept answer is dropped")
        return "", Changes(everything=True)


def _doc(change: RunChange) -> dict[str, Any]:
    """A run's change, compact: what is unset is left out, and so are an inserted run's columns
    (every reader takes an insert as a change of all of them)."""
    doc = {
        "c": [] if change.inserted else sorted(change.columns),
        "i": change.inserted,
        "d": change.deleted,
        "v": change.events,
        "s": change.status,
        "t": change.team,
    }
    return {k: v for k, v in doc.items() if v}


def _change(doc: dict[str, Any]) -> RunChange:
    return RunChange(
        columns={str(c) for c in doc.get("c", [])},
        inserted=bool(doc.get("i")),
        deleted=bool(doc.get("d")),
        events=bool(doc.get("v")),
        status=doc.get("s"),
        team=doc.get("t"),
    )


class ChangeFeed:
    """This replica's side of the feed: ``publish`` in each write transaction, ``listen`` on
    the event loop for the others'. ``wanted``: which run changes are worth telling."""

    def __init__(self, url: str, wanted: Callable[[RunChange], bool]) -> None:
        self.origin = secrets.token_hex(8)
        self._own = _dumps({"o": self.origin})[:-1]  # how this replica's payloads begin
        self._wanted = wanted
        # psycopg's own connection string (never logged: it may hold a password).
        self._conninfo = make_url(url).set(drivername="postgresql").render_as_string(False)
        # Set while a LISTEN is in place (the app waits for it before its first request).
        self.listening = asyncio.Event()
        # What commits told and ``send`` has not sent yet; the loop to wake when it is new.
        self._told = Changes()
        self._told_lock = threading.Lock()
        self._wake: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None

    def _worth_telling(self, changes: Changes) -> Changes:
        runs = {run_id: c for run_id, c in changes.runs.items() if self._wanted(c)}
        return Changes(runs=runs, everything=changes.everything, tokens=changes.tokens)

    def publish(self, session: Session, changes: Changes) -> None:
        """Tell the other replicas, in the write's transaction (sent if it commits)."""
        for payload in payloads(self._worth_telling(changes), self.origin):
            session.execute(select(func.pg_notify(CHANNEL, payload)))

    def tell(self, changes: Changes) -> None:
        """After a commit, on any thread: have ``send`` tell the other replicas."""
        told = self._worth_telling(changes)
        if not told:
            return
        with self._told_lock:
            first = not self._told
            self._told.then(told)
            if len(self._told.runs) > MAX_UNSENT_RUNS:  # not sending for long: keep it small
                self._told.then(Changes(everything=True))
            wake = self._wake
        if first and wake is not None:
            with contextlib.suppress(RuntimeError):  # the loop has closed: nobody sends
                wake[0].call_soon_threadsafe(wake[1].set)

    async def run(self, deliver: Callable[[Changes], None]) -> None:
        """Listen and send (``listen``, ``send``) until cancelled."""
        await asyncio.gather(self.listen(deliver), self.send())

    async def send(self) -> None:
        """Send what commits told (``tell``) until cancelled: all that came while the last
        notification was on its way or within ``SEND_EVERY_S`` of it, in one round trip. What
        a lost connection may not have sent is sent again as everything."""
        loop, wake = asyncio.get_running_loop(), asyncio.Event()
        with self._told_lock:
            self._wake = (loop, wake)
            if self._told:
                wake.set()

        async def sending(conn: psycopg.AsyncConnection[Any]) -> None:
            next_at = loop.time()
            while True:
                await wake.wait()
                await asyncio.sleep(max(0.0, next_at - loop.time()))
                next_at = loop.time() + SEND_EVERY_S
                wake.clear()
                with self._told_lock:
                    told, self._told = self._told, Changes()
                try:
                    await conn.execute(SEND, (CHANNEL, payloads(told, self.origin)))
                except BaseException:
                    self.tell(Changes(everything=True))
                    raise

        await self._connected("sending", sending)

    async def listen(self, deliver: Callable[[Changes], None]) -> None:
        """Hand every other replica's change to ``deliver`` (on the loop) until cancelled; a
        lost connection is made again, and ``deliver`` told everything may have changed."""

        async def listening(conn: psycopg.AsyncConnection[Any]) -> None:
            await conn.execute(f"LISTEN {CHANNEL}")
            deliver(Changes(everything=True))  # what came while nobody listened
            self.listening.set()
            async for note in conn.notifies():
                if not note.payload.startswith(self._own):
                    deliver(decode(note.payload)[1])

        await self._connected("listening", listening, self.listening.clear)

    async def _connected(
        self,
        doing: str,
        use: Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]],
        lost: Callable[[], None] = lambda: None,
    ) -> None:
        """``use`` a connection of its own until cancelled: a lost one (or an unexpected error)
        is logged, ``lost`` called, and a new one made after a pause (``RETRY_S``)."""
        failures = 0
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    self._conninfo, autocommit=True
                ) as conn:
                    failures = 0
                    await use(conn)
            except (psycopg.Error, OSError) as exc:
                log.warning("the change feed is not %s (%s); retrying", doing, type(exc).__name__)
            except Exception:  # never the end of the feed: it starts again from everything
                log.exception("the change feed failed %s; retrying", doing)
            lost()
            await asyncio.sleep(RETRY_S[min(failures, len(RETRY_S) - 1)])
            failures += 1

"""Answers of hot reads kept between writes: many clients polling one run cost one read of the
database per change, not one per request.

A kept answer has a scope: the runs it shows (``GET /runs/{id}``), or the runs a page shows and
those that could enter it (``GET /runs``). It is dropped when a write transaction of this
process that changed its scope commits (``Database.on_commit``, before the write's own request
answers: its caller reads its write), and it is served for at most ``ttl_s`` in any case. What
counts as a change is what the answer shows besides metrics: a new run, a status, an event, any
column shown. A running run's metrics (written by the follower every second) drop nothing: its
answer shows them at most ``ttl_s`` old. On PostgreSQL another replica's write drops the same
answers once its notification arrives (``service/store/change_feed.py``, usually milliseconds
after its commit); ``ttl_s`` is the bound on how long one goes unseen if a notification is lost,
and on SQLite, that of another process. A request never joins a read, nor is an answer kept,
that began before a write to its scope.

Concurrent misses of one key share one read. Where a miss is read is the route's
(``Database.run_read``: on SQLite on the event loop, on PostgreSQL on a worker thread or awaited
on the loop).
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import cached_property
from itertools import takewhile
from typing import Protocol

from fastapi import Response
from sqlalchemy import Column, select
from sqlalchemy.sql.visitors import iterate

from service.store.changes import Changes, RunChange
from service.store.db import Database
from service.store.runs import RUN_COLUMNS

# The columns of ``runs`` a run's answer (and a page, a part of it) shows: a change to another
# (the follower's ``last_output_at``, a claim) drops nothing.
SHOWN = frozenset(
    c.name
    for expr in select(*RUN_COLUMNS).selected_columns
    for c in iterate(expr)
    if isinstance(c, Column)
)
# Writes remembered for the reads under way: a read that began before the oldest is not kept.
_REMEMBERED = 1024


def shown_change(change: RunChange) -> bool:
    """Whether the change alters what the run's answer shows (metrics aside)."""
    return change.inserted or change.deleted or change.events or bool(change.columns & SHOWN)


class Scope(Protocol):
    # The runs whose change may drop the answer; None: any run's (checked for every write).
    @property
    def runs(self) -> frozenset[str] | None: ...

    def changed_by(self, changes: Changes) -> bool: ...


@dataclass(frozen=True)
class OneRun:
    """The scope of an answer showing one run."""

    run_id: str

    @property
    def runs(self) -> frozenset[str]:
        return frozenset((self.run_id,))

    def changed_by(self, changes: Changes) -> bool:
        change = changes.runs.get(self.run_id)
        return changes.everything or (change is not None and shown_change(change))


@dataclass(frozen=True)
class Page:
    """The scope of a page of runs (newest first, ``limit`` and one more read): the runs it
    read (None before it is read: any), and the filters a run must pass to enter it."""

    statuses: frozenset[str] | None
    team: str | None
    cursor: str | None
    read: frozenset[str] | None = None
    # The oldest run read when the page had more than it shows (a newer run entering pushes
    # it out); None when all that pass the filters were read (any new one changes the page).
    oldest: str | None = None

    @property
    def runs(self) -> None:
        return None

    def changed_by(self, changes: Changes) -> bool:
        if changes.everything:
            return True
        return any(self._changed(run_id, c) for run_id, c in changes.runs.items())

    def _changed(self, run_id: str, change: RunChange) -> bool:
        if not shown_change(change):
            return False
        if self.read is None or run_id in self.read:
            return True
        # Another run changes the page only by entering it: new, or moved into its statuses.
        if not change.inserted and "status" not in change.columns:
            return False
        return (
            (self.statuses is None or change.status is None or change.status in self.statuses)
            and (self.team is None or change.team is None or change.team == self.team)
            and (self.cursor is None or run_id < self.cursor)
            and (self.oldest is None or run_id > self.oldest)
        )


@dataclass(frozen=True)
class Answer:
    """A serialised answer, the team of the run it shows ("" if it shows no one run), and
    its scope when the read found it (a page: the runs it read)."""

    body: bytes
    team: str = ""
    scope: Scope | None = None

    @cached_property
    def etag(self) -> str:
        return f'"{hashlib.blake2b(self.body, digest_size=12).hexdigest()}"'


def respond(answer: Answer, if_none_match: str | None) -> Response:
    """The answer (200), or 304 and no body when the caller holds it already: a poller that
    sends back the ``ETag`` (``curl --etag-save/--etag-compare``) downloads a run once per change.
    Check access before: a 304 says the resource exists."""
    headers = {"ETag": answer.etag, "Cache-Control": "no-cache"}
    held = {tag.strip().removeprefix("W/") for tag in (if_none_match or "").split(",")}
    if answer.etag in held or "*" in held:
        return Response(status_code=304, headers=headers)
    return Response(answer.body, media_type="application/json", headers=headers)


@dataclass(frozen=True)
class _Kept:
    at: float
    answer: Answer
    scope: Scope


class ReadCache:
    """At most ``max_bytes`` of answers; past it the oldest kept go first."""

    def __init__(self, db: Database, ttl_s: float, max_bytes: int = 32 << 20) -> None:
        self._ttl_s = ttl_s
        self._max_bytes = max_bytes
        self._bytes = 0
        self._entries: dict[str, _Kept] = {}
        # Keys kept by run, for the scopes that name their runs; the others are checked always.
        self._by_run: dict[str, set[str]] = {}
        self._any_run: set[str] = set()
        # Writes that changed something shown, numbered: (number, changes), the newest last.
        self._writes = 0
        self._recent: deque[tuple[int, Changes]] = deque(maxlen=_REMEMBERED)
        self._lock = threading.Lock()  # held for dict updates only, never across a hand-over
        # Reads under way, by key: touched on the event loop's thread only.
        self._flights: dict[str, tuple[int, Scope, asyncio.Future[Answer]]] = {}
        db.on_commit(self.changed)

    def kept(self, key: str) -> Answer | None:
        """The answer kept for ``key``, if still good (no read)."""
        kept = self._entries.get(key)
        if kept is not None and time.monotonic() - kept.at < self._ttl_s:
            return kept.answer
        return None

    async def answer(self, key: str, scope: Scope, read: Callable[[], Awaitable[Answer]]) -> Answer:
        """The kept answer for ``key`` if still good, else ``await read()`` (shared by the
        requests that miss meanwhile); ``scope`` is what the answer can show before it is read."""
        if (answer := self.kept(key)) is not None:
            return answer
        flight = self._flights.get(key)
        with self._lock:
            stale = flight is None or self._changed_since(flight[0], flight[1])
        if flight is None or stale:
            began = self._writes
            future = asyncio.ensure_future(self._read(key, scope, read, began))
            self._flights[key] = flight = (began, scope, future)
            future.add_done_callback(lambda done: self._landed(key, done))
        # Shielded: a client that goes away does not cancel the read others wait for.
        return await asyncio.shield(flight[2])

    async def _read(
        self, key: str, scope: Scope, read: Callable[[], Awaitable[Answer]], began: int
    ) -> Answer:
        # ``began`` and ``at`` are taken before the read's snapshot: a write that commits while
        # it runs leaves the answer already out of date, never kept as current.
        at = time.monotonic()
        answer = await read()
        scope = answer.scope or scope
        if self._ttl_s <= 0 or len(answer.body) > self._max_bytes:
            return answer
        with self._lock:
            if self._changed_since(began, scope):
                return answer
            kept = self._entries.get(key)
            if kept is not None and kept.at > at:
                return answer  # a read that began after this one landed first: it stays
            self._drop(key)
            while self._entries and self._bytes + len(answer.body) > self._max_bytes:
                self._drop(next(iter(self._entries)))
            self._entries[key] = _Kept(at, answer, scope)
            self._bytes += len(answer.body)
            runs = scope.runs
            if runs is None:
                self._any_run.add(key)
            for run_id in runs or ():
                self._by_run.setdefault(run_id, set()).add(key)
        return answer

    def _changed_since(self, began: int, scope: Scope) -> bool:
        """Whether a write numbered after ``began`` changed ``scope`` (or may have: one too
        old to be remembered). Under the lock."""
        if self._writes - began > len(self._recent):
            return True
        # Newest first, and only those after ``began``: a read with no write since costs nothing.
        since = takewhile(lambda write: write[0] > began, reversed(self._recent))
        return any(scope.changed_by(changes) for _number, changes in since)

    def changed(self, changes: Changes) -> None:
        """Drop what a write changed: one of this process (on the writer's thread, after its
        commit) or of another replica (``ChangeFeed``, on the event loop)."""
        if not changes.everything and not any(map(shown_change, changes.runs.values())):
            return
        with self._lock:
            self._writes += 1
            self._recent.append((self._writes, changes))
            if changes.everything:
                keys: set[str] = set(self._entries)
            else:
                keys = set(self._any_run)
                for run_id in changes.runs:
                    keys |= self._by_run.get(run_id, set())
            for key in keys:
                kept = self._entries.get(key)
                if kept is not None and kept.scope.changed_by(changes):
                    self._drop(key)

    def _drop(self, key: str) -> None:
        kept = self._entries.pop(key, None)
        if kept is None:
            return
        self._bytes -= len(kept.answer.body)
        self._any_run.discard(key)
        for run_id in kept.scope.runs or ():
            keys = self._by_run.get(run_id)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._by_run[run_id]

    def _landed(self, key: str, done: asyncio.Future[Answer]) -> None:
        flight = self._flights.get(key)
        if flight is not None and flight[2] is done:
            del self._flights[key]
        if not done.cancelled():
            done.exception()  # retrieved: a failed read is its waiters' error, not the loop's

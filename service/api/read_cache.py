"""Answers of hot reads kept between writes: many clients polling one run cost one read of the
database per change, not one per request.

An answer is served while no write transaction of this process has committed since it was read
(``Database.generation``), and for at most ``ttl_s``: the bound on how long a write by another
replica (which this process does not see) can go unseen. Concurrent misses of one key share
one read, and a request never joins a read that began before the last write it could know of.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

from fastapi import Response
from fastapi.concurrency import run_in_threadpool

from service.store.db import Database


@dataclass(frozen=True)
class Answer:
    """A serialised answer and the team of the run it shows ("" if it shows no one run)."""

    body: bytes
    team: str = ""

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


class ReadCache:
    """At most ``max_bytes`` of answers; past it the oldest kept go first."""

    def __init__(self, db: Database, ttl_s: float, max_bytes: int = 32 << 20) -> None:
        self._db = db
        self._ttl_s = ttl_s
        self._max_bytes = max_bytes
        self._bytes = 0
        self._entries: dict[str, tuple[int, float, Answer]] = {}
        self._lock = threading.Lock()  # held for dict updates only, never across a hand-over
        # Reads under way, by key: touched on the event loop's thread only.
        self._flights: dict[str, tuple[int, asyncio.Future[Answer]]] = {}

    async def answer(self, key: str, read: Callable[[], Answer]) -> Answer:
        """The kept answer for ``key`` if still good, else ``read()`` on a worker thread."""
        entry = self._entries.get(key)
        generation = self._db.generation
        if entry and entry[0] == generation and time.monotonic() - entry[1] < self._ttl_s:
            return entry[2]
        flight = self._flights.get(key)
        if flight is None or flight[0] != generation:
            future = asyncio.ensure_future(run_in_threadpool(self._read, key, read))
            self._flights[key] = flight = (generation, future)
            future.add_done_callback(lambda done: self._landed(key, done))
        # Shielded: a client that goes away does not cancel the read others wait for.
        return await asyncio.shield(flight[1])

    def _read(self, key: str, read: Callable[[], Answer]) -> Answer:
        # The generation is taken before the read's snapshot: a write that commits while it
        # runs leaves the answer already out of date, never kept as current.
        generation, at = self._db.generation, time.monotonic()
        answer = read()
        if self._ttl_s > 0 and len(answer.body) <= self._max_bytes:
            with self._lock:
                kept = self._entries.pop(key, None)
                if kept:
                    self._bytes -= len(kept[2].body)
                # A read that began after this one and landed first stays.
                entry = kept if kept and kept[0] > generation else (generation, at, answer)
                while self._entries and self._bytes + len(entry[2].body) > self._max_bytes:
                    oldest = self._entries.pop(next(iter(self._entries)))
                    self._bytes -= len(oldest[2].body)
                self._entries[key] = entry
                self._bytes += len(entry[2].body)
        return answer

    def _landed(self, key: str, done: asyncio.Future[Answer]) -> None:
        flight = self._flights.get(key)
        if flight is not None and flight[1] is done:
            del self._flights[key]
        if not done.cancelled():
            done.exception()  # retrieved: a failed read is its waiters' error, not the loop's

"""Live event streams end when their caller's API token is revoked: at once for a revocation
made on this replica, within ``POLL_S`` for one made on another (one query per poll for every
token that has a stream open here, whatever the number of streams)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TypeVar

import anyio

from service.store import tokens
from service.store.db import Database

log = logging.getLogger(__name__)
POLL_S = 0.5


class Revocations:
    def __init__(self, poll_s: float = POLL_S) -> None:
        self.poll_s = poll_s
        self._open: dict[str, set[asyncio.Event]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None

    @contextlib.asynccontextmanager
    async def watching(self, db: Database, token_id: str) -> AsyncIterator[asyncio.Event]:
        """An event set once ``token_id`` is revoked, for as long as the stream is open."""
        self._loop = asyncio.get_running_loop()
        event = asyncio.Event()
        self._open.setdefault(token_id, set()).add(event)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._poll(db))
        try:
            yield event
        finally:
            events = self._open.get(token_id, set())
            events.discard(event)
            if not events:
                self._open.pop(token_id, None)

    def revoked(self, token_id: str) -> None:
        """This replica revoked ``token_id``; safe from any thread."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._end, token_id)

    def _end(self, token_id: str) -> None:
        for event in self._open.get(token_id, ()):
            event.set()

    async def _poll(self, db: Database) -> None:
        while self._open:
            await asyncio.sleep(self.poll_s)
            ids = list(self._open)
            if not ids:
                break
            try:
                gone = await asyncio.to_thread(_revoked_among, db, ids)
            except Exception as exc:  # the database away: streams go on, checked next poll
                log.debug("revocation check failed: %r", exc)
                continue
            for token_id in gone:
                self._end(token_id)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


def _revoked_among(db: Database, ids: list[str]) -> list[str]:
    with db.read() as session:
        return tokens.revoked_among(session, ids)


T = TypeVar("T")


async def until_set(event: asyncio.Event, source: AsyncIterator[T]) -> AsyncGenerator[T, None]:
    """``source``'s items until ``event`` is set; then ``source`` is closed and nothing more."""
    stop = asyncio.ensure_future(event.wait())
    step: asyncio.Future[T] | None = None
    try:
        while True:
            step = asyncio.ensure_future(anext(source))
            await asyncio.wait({step, stop}, return_when=asyncio.FIRST_COMPLETED)
            if not step.done():
                return
            try:
                item = step.result()
            except StopAsyncIteration:
                return
            yield item
    finally:
        # Shielded: a stream whose client left is ended by a cancelled scope, which would cancel
        # each await here in turn and leave the source running until the collector found it.
        with anyio.CancelScope(shield=True):
            stop.cancel()
            await asyncio.gather(stop, return_exceptions=True)
            # A step still running (revoked, or this stream cancelled: its client left) is
            # ended before the source is closed: a generator cannot be closed while it runs.
            # One that ended as this stream was cancelled has its outcome retrieved (the
            # source's end, StopAsyncIteration, is no error of the loop's).
            if step is not None:
                if not step.done():
                    step.cancel()
                await asyncio.gather(step, return_exceptions=True)
            aclose = getattr(source, "aclose", None)
            if aclose is not None:
                await aclose()

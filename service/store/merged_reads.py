"""Reads of rows by key, merged under load (on one event loop).

One read is out at a time: a key asked meanwhile waits for it to end, then is read with every
other key waiting (``at_most`` of them), in one statement. Alone, a read waits for none; under
load a miss costs its row, not a round trip of its own (on PostgreSQL on two cores, one read out
at a time answered more than two or four). A read never starts before its key is asked, so it
sees every write committed before.

A read that takes more than ``timeout_s`` is given up (``TimeoutError``), so that a read that
never ends (a connection gone silent) holds up the others for that long at most. A key the
database refuses (``alone_on``, e.g. a NUL character on PostgreSQL) fails only its own
request: a merged read that raises it is read again key by key.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Any

# The rows of a list of keys, each row's first column its key.
ReadKeys = Callable[[list[Any]], Awaitable[Sequence[Any]]]


class MergedReads:
    """The reads of one statement by key; ``read`` gives the rows of a list of keys."""

    def __init__(
        self,
        read: ReadKeys,
        at_most: int = 64,
        alone_on: type[Exception] | tuple[type[Exception], ...] = (),
        timeout_s: float | None = None,
    ) -> None:
        self._read = read
        self._timeout_s = timeout_s
        self._at_most = at_most
        self._alone_on = alone_on
        self._reading = False
        self._waiting: dict[Hashable, list[asyncio.Future[Any]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()  # (held: the loop keeps tasks weakly)

    async def row(self, key: Hashable) -> Any | None:
        """The row of ``key``, None if there is none."""
        if self._reading:
            waiter: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            self._waiting.setdefault(key, []).append(waiter)
            return await waiter
        self._reading = True
        try:
            return _by_key(await self._rows([key]), [key])[key]
        finally:
            self._ended()

    def _ended(self) -> None:
        """A read ended: the keys waiting are read next."""
        self._reading = False
        if not self._waiting:
            return
        keys = list(itertools.islice(self._waiting, self._at_most))
        batch = {key: self._waiting.pop(key) for key in keys}
        self._reading = True
        task = asyncio.ensure_future(self._answer(batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, batch: dict[Hashable, list[asyncio.Future[Any]]]) -> None:
        try:
            found = await self._found(list(batch))
            for key, waiters in batch.items():
                for waiter in waiters:
                    if waiter.done():
                        continue
                    if isinstance(got := found[key], Exception):
                        waiter.set_exception(got)
                    else:
                        waiter.set_result(got)
        finally:
            for waiters in batch.values():
                for waiter in waiters:
                    waiter.cancel()  # (none left but if the read itself was cancelled)
            self._ended()

    async def _found(self, keys: list[Hashable]) -> dict[Hashable, Any]:
        """Key -> its row (None: none), or the error its read raised."""
        try:
            rows = await self._rows(keys)
        except self._alone_on as exc:
            if len(keys) == 1:
                return {keys[0]: exc}
            found: dict[Hashable, Any] = {}
            for key in keys:
                found |= await self._found([key])
            return found
        except Exception as exc:
            return dict.fromkeys(keys, exc)
        return _by_key(rows, keys)

    async def _rows(self, keys: list[Hashable]) -> Sequence[Any]:
        async with asyncio.timeout(self._timeout_s):
            return await self._read(keys)


def _by_key(rows: Sequence[Any], keys: list[Hashable]) -> dict[Hashable, Any]:
    """Key -> its row, None for a key with none (a row is its key's if its first column is)."""
    found = {row[0]: row for row in rows}
    return {key: found.get(key) for key in keys}

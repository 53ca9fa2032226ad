"""PostgreSQL's hottest reads awaited on the event loop, on psycopg's own async pool
(``psycopg_pool``): each is one prebuilt statement (``prepared``), outside a transaction, on a
connection in autocommit.

Handing out a pooled connection costs psycopg's pool a fraction of what SQLAlchemy's async
engine spends on it (a greenlet hop to check a connection out, a task and another hop to check
it in and reset it): a third of such a read. The statement is still SQLAlchemy Core, compiled by
the database's engine, whose statement listeners see it; a driver error is still SQLAlchemy's,
so ``db._bounded`` maps it as any other. A connection that is lost is closed, and the pool's
idle ones are checked, so the pool renews whatever the server dropped instead of handing it out.
Reads by key (``row_of``: a run's page) are merged under load (``merged_reads.py``).

The pool's connections belong to the loop that opened them: on another loop (a test's next
``asyncio.run``) a new pool is opened, and the old one's connections, unusable there, are left
to close with their objects.
"""

from __future__ import annotations

import asyncio
from typing import Any

from psycopg import AsyncConnection
from psycopg.types.json import set_json_loads
from psycopg_pool import AsyncConnectionPool, PoolTimeout
from pydantic_core import from_json
from sqlalchemy import Engine
from sqlalchemy import exc as sa_exc

from service.errors import DatabaseBusy
from service.store.merged_reads import MergedReads
from service.store.prepared import Prepared, fetch_async


class LoopReads:
    """At most ``size`` connections to ``engine``'s database for the event loop's reads; a read
    waits ``wait_s`` at most for one (then SQLAlchemy's ``TimeoutError``, as its pool's)."""

    def __init__(self, engine: Engine, size: int, wait_s: float, options: str) -> None:
        self.engine = engine
        self._size = size
        self._wait_s = wait_s
        self._conninfo = engine.url.set(drivername="postgresql").render_as_string(
            hide_password=False
        )
        self._options = options
        self._pool: AsyncConnectionPool[AsyncConnection[Any]] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._merged: dict[tuple[Prepared, str], MergedReads] = {}

    def _current(self, keep: int = 0) -> AsyncConnectionPool[AsyncConnection[Any]]:
        loop = asyncio.get_running_loop()
        if self._pool is None or self._loop is not loop:
            self._pool = AsyncConnectionPool(
                self._conninfo,
                min_size=keep,
                max_size=self._size,
                # The few statements read here are prepared on a connection's first use of each,
                # and planned then: each is a read by key whose best plan does not depend on the
                # key (PostgreSQL would plan a read by a list of keys at every execution).
                kwargs={
                    "autocommit": True,
                    "options": f"{self._options} -c plan_cache_mode=force_generic_plan",
                    "prepare_threshold": 0,
                },
                configure=_configure,
                timeout=self._wait_s,
                max_lifetime=1800,
                open=False,
            )
            self._loop = loop
            self._merged = {}
        return self._pool

    async def open(self, keep: int) -> None:
        """Open this loop's pool, ``keep`` connections made at once in the background and kept
        open (the served app: its first reads wait for no connection to be made). A pool opened
        by a read instead makes connections only as reads ask for them."""
        await self._current(min(keep, self._size)).open()

    async def rows(self, prepared: Prepared, params: dict[str, Any]) -> list[Any]:
        pool = self._current()
        if pool.closed:
            await pool.open()
        try:
            async with pool.connection() as conn:
                return await fetch_async(conn, self.engine, prepared, params)
        except PoolTimeout as exc:
            raise sa_exc.TimeoutError(str(exc)) from exc
        except sa_exc.DBAPIError as exc:
            if exc.connection_invalidated:
                # The server dropped one: the others may be gone too (a restart). Each idle one
                # is tried and replaced if it is, so only this read is refused.
                await pool.check()
            raise

    async def row_of(self, prepared: Prepared, param: str, key: Any) -> Any | None:
        """The row of ``prepared`` for ``key`` (its first column), None if there is none;
        ``param`` is the statement's list of keys. Concurrent reads are merged
        (``MergedReads``)."""
        self._current()  # (on a new loop, a new pool and no merges of the old loop's)
        merged = self._merged.get((prepared, param))
        if merged is None:

            async def read(keys: list[Any]) -> list[Any]:
                return await self.rows(prepared, {param: keys})

            merged = MergedReads(read, alone_on=sa_exc.DataError, timeout_s=self._wait_s)
            self._merged[(prepared, param)] = merged
        try:
            return await merged.row(key)
        except TimeoutError as exc:
            raise DatabaseBusy(f"the database did not answer within {self._wait_s:g} s") from exc

    async def close(self) -> None:
        """Close the pool's connections if this loop opened them (another loop's are left)."""
        pool, loop = self._pool, self._loop
        self._pool = self._loop = None
        if pool is not None and not pool.closed and loop is asyncio.get_running_loop():
            await pool.close()


async def _configure(conn: AsyncConnection[Any]) -> None:
    # JSON columns (a run's spec and launch) parsed by pydantic-core, as the engine's are.
    set_json_loads(from_json, conn)

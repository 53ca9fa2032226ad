"""Engine, sessions, the transaction boundaries (reads, with or without the ORM, and the write
one, which tells what it changed after its commit), and migrations to head.

Every wait for the database is bounded by ``wait_s``: this process's turn to write (SQLite),
a pooled connection, SQLite's busy handler, a PostgreSQL row lock. Past it, ``DatabaseBusy``
(a 503 with ``Retry-After``); so is a connection the server dropped. A transaction is opened
and closed by one thread in one call (``with db.read() as s:`` inside a route body or a loop's
tick), never across a hand-over to another thread: so no thread ever waits on a lock whose
release needs another worker thread. (Accepts committed together, ``group_commit``, wait for the
thread that is writing them, which holds their transaction and waits for no other.)
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any, TypeVar

import anyio.to_thread
from alembic import command
from alembic.config import Config
from pydantic_core import from_json
from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy import exc as sa_exc
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import PoolProxiedConnection, SingletonThreadPool

import migrations
from service.errors import DatabaseBusy
from service.store.changes import Changes
from service.store.loop_reads import LoopReads
from service.store.prepared import DriverConnection, Prepared, RowsConnection, fetch

log = logging.getLogger(__name__)
T = TypeVar("T")
MIGRATIONS_DIR = Path(migrations.__file__).parent
# Marks the engine of read transactions (same pool): SQLite opens them with a deferred BEGIN.
READ_ONLY = "rlrun_read_only"
# How long a read on the event loop waits for a locked SQLite database before it is a 503: a
# WAL reader meets a lock only in rare cases (recovery of another process's crash).
LOOP_WAIT_S = 0.1
# PostgreSQL connections for the reads awaited on the loop: a fixed few (each read is one short
# round trip). A read past them waits for one, on the loop, which costs nothing; connections
# opened for a peak would be closed after it, each costing the server a process.
LOOP_POOL = 16
LOOP_KEPT = 4  # of them kept open by a served app, made at its start


def make_engine(
    url: str,
    wait_s: float = 5.0,
    pool_size: int = 20,
    max_overflow: int = 30,
    per_thread: bool = False,
) -> Engine:
    """The engine of ``url``; ``per_thread``: a connection of each thread's own (SQLite), kept
    for it, instead of a shared pool."""
    kwargs: dict[str, Any] = (
        {"poolclass": SingletonThreadPool, "pool_size": pool_size}
        if per_thread
        else {"pool_size": pool_size, "max_overflow": max_overflow, "pool_timeout": wait_s}
    )
    if url.startswith("postgresql"):
        kwargs |= _postgres_options(wait_s)
    if url.startswith("sqlite"):
        # The driver's own transaction handling is off; we BEGIN ourselves: IMMEDIATE for
        # writes (a transaction that reads then writes never fails on a lock upgrade), deferred
        # for reads (WAL readers take no lock and run beside the writer).
        kwargs["connect_args"] = {
            "check_same_thread": False,
            "timeout": wait_s,
            "isolation_level": None,
        }
    # JSON columns (a run's spec and launch, read on every cold read of a run) are parsed by
    # pydantic-core: the same values as the standard library's parser, in under half the time.
    engine = create_engine(url, json_deserializer=from_json, **kwargs)
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", _sqlite_pragmas(wait_s))
        event.listen(engine, "begin", _sqlite_begin)
    return engine


def _postgres_options(wait_s: float) -> dict[str, Any]:
    # No ping before each use (a round trip per request): a connection the server dropped
    # fails once, the pool is renewed and that request is a 503 to retry (see _bounded).
    lock_ms = int(wait_s * 1000)
    return {"pool_recycle": 1800, "connect_args": {"options": f"-c lock_timeout={lock_ms}"}}


def _sqlite_pragmas(wait_s: float) -> Any:
    def on_connect(dbapi_conn: Any, _record: Any) -> None:
        cur = dbapi_conn.cursor()
        # WAL lets readers run beside the one writer; FKs are off by default in SQLite.
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute(f"PRAGMA busy_timeout={int(wait_s * 1000)}")
        cur.close()

    return on_connect


def _sqlite_begin(conn: Connection) -> None:
    if conn.get_execution_options().get(READ_ONLY, False):
        # A deferred BEGIN takes no lock, so it waits for none: straight to the driver (the
        # engine's execution of a statement costs several times SQLite's).
        conn.connection.driver_connection.execute("BEGIN")  # type: ignore[union-attr]
        return
    # Through the engine (not the driver's connection), so that a lock held too long is
    # SQLAlchemy's OperationalError, which becomes a 503 with Retry-After.
    conn.exec_driver_sql("BEGIN IMMEDIATE")


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str) -> None:
    command.downgrade(alembic_config(url), revision)


class Database:
    """Owns the engine and the transaction boundaries:
    ``with db.read() as s: ...`` and ``with db.transaction() as s: ...`` (the write one)."""

    def __init__(
        self, url: str, wait_s: float = 5.0, pool_size: int = 20, max_overflow: int = 30
    ) -> None:
        self.url = url
        self.wait_s = wait_s
        self.engine = make_engine(url, wait_s, pool_size, max_overflow)
        self._writers = sessionmaker(self.engine, expire_on_commit=False)
        self._read_engine = self.engine.execution_options(**{READ_ONLY: True})
        self._readers = sessionmaker(self._read_engine, expire_on_commit=False)
        event.listen(self._readers, "before_flush", _refuse_writes)
        # Where the hottest reads run (``run_read``, ``rows``): on the event loop.
        # SQLite: a few indexed rows, no round trip, and a WAL reader takes no lock, so a read
        # costs less there than the hand-over to a worker thread; on a connection of the loop's
        # own, so it never waits for the pool, and for a lock LOOP_WAIT_S at most. PostgreSQL:
        # one statement awaited through psycopg's async driver, on its own pool (``loop_reads``:
        # its connections belong to the loop that made them).
        self.reads_on_loop = self.engine.dialect.name == "sqlite"
        self._own_engine: Engine | None = None
        self._own: tuple[Engine, sessionmaker[Session]] | None = None
        if self.reads_on_loop:
            self._own_engine = make_engine(url, LOOP_WAIT_S, pool_size=2, per_thread=True)
            own_reads = self._own_engine.execution_options(**{READ_ONLY: True})
            self._own = (own_reads, sessionmaker(own_reads, expire_on_commit=False))
            event.listen(self._own[1], "before_flush", _refuse_writes)
        self._thread = threading.local()
        self._loop_reads: LoopReads | None = None
        if self.engine.dialect.name == "postgresql":
            options = _postgres_options(wait_s)["connect_args"]["options"]
            self._loop_reads = LoopReads(self.engine, min(pool_size, LOOP_POOL), wait_s, options)
        # SQLite has one writer at a time; queueing this process's writers here is fairer and
        # faster than letting them sleep in SQLite's busy handler (other processes still meet
        # busy_timeout). Taken and released by the same thread, within one call.
        self._write_turn = threading.Lock() if self.engine.dialect.name == "sqlite" else None
        # What the write transaction open on each thread changed, told after its commit to
        # whoever listens (``service/api/read_cache.py``).
        self._changes = threading.local()
        self._on_commit: list[Callable[[Changes], None]] = []
        self._before_commit: list[Callable[[Session, Changes], None]] = []
        event.listen(self.engine, "before_cursor_execute", self._record)

    @property
    def engines(self) -> tuple[Engine, ...]:
        """Every engine this database sends statements on: the pooled one, and SQLite's own
        connection of the event loop (PostgreSQL's reads on the loop, ``loop_reads``, are told
        to the pooled engine's listeners); what listens for statements listens on each."""
        if self._own_engine is not None:
            return self.engine, self._own_engine
        return (self.engine,)

    def on_commit(self, listener: Callable[[Changes], None]) -> None:
        """Call ``listener`` with what each write transaction of this process changed of the
        runs, after its commit (on the thread that committed, before ``transaction`` returns)."""
        self._on_commit.append(listener)

    def before_commit(self, listener: Callable[[Session, Changes], None]) -> None:
        """Call ``listener`` in each write transaction that changed runs, with its session and
        what it changed, last before the commit (its pending changes flushed first)."""
        self._before_commit.append(listener)

    def open_changes(self) -> Changes:
        """What the write transaction open on this thread changes of the runs (filled in as its
        statements run, its commit's included)."""
        changes: Changes | None = getattr(self._changes, "open", None)
        if changes is None:
            raise RuntimeError("no write transaction is open on this thread")
        return changes

    @contextmanager
    def _own_connection(self) -> Iterator[None]:
        """The reads of this block (``read``, ``read_rows``) on this thread's own connection
        (SQLite, ``reads_on_loop``): for reads on the event loop, which must not wait for the
        pool."""
        outer = getattr(self._thread, "own", False)
        self._thread.own = self._own is not None
        try:
            yield
        finally:
            self._thread.own = outer

    def _on_own_connection(self) -> bool:
        """Whether this thread's reads go to its own SQLite connection (``_own_connection``)."""
        return self._own is not None and getattr(self._thread, "own", False)

    def _reading(self) -> tuple[Engine, sessionmaker[Session], float]:
        if self._own is not None and self._on_own_connection():
            return (*self._own, LOOP_WAIT_S)
        return self._read_engine, self._readers, self.wait_s

    @contextmanager
    def read(self) -> Iterator[Session]:
        """A read transaction (one snapshot); it takes no write lock and must not write."""
        _, readers, wait_s = self._reading()
        with _bounded(wait_s), readers() as session, session.begin():
            yield session

    @contextmanager
    def read_rows(self) -> Iterator[RowsConnection]:
        """``read`` without the ORM: a connection in a read transaction, for the hottest reads
        (a session costs more than a small query), their rows ``prepared.fetch``-ed. On the
        event loop's own SQLite connection, the driver's connection itself: SQLAlchemy's
        connection and transaction were a third of the cost of a run's read."""
        if self._own_engine is not None and self._on_own_connection():
            with _bounded(LOOP_WAIT_S), closing(self._own_raw()) as own:
                driver: Any = own.driver_connection
                driver.execute("BEGIN")  # deferred: it takes no lock
                try:
                    yield DriverConnection(driver, self._own_engine)
                finally:
                    driver.commit()
            return
        engine, _, wait_s = self._reading()
        with _bounded(wait_s), engine.connect() as conn, conn.begin():
            yield conn

    def _own_raw(self) -> PoolProxiedConnection:
        """This thread's own SQLite connection; a failure to open it (a file another process
        holds locked) raised as SQLAlchemy's, as ``Engine.connect`` raises it."""
        assert self._own_engine is not None
        try:
            return self._own_engine.raw_connection()
        except sqlite3.Error as exc:
            raise sa_exc.DBAPIError.instance(None, None, exc, sqlite3.Error) from exc

    async def rows(self, prepared: Prepared, params: dict[str, Any]) -> list[Any]:
        """The rows of one prebuilt read (``prepared``) on the event loop, for the hottest reads:
        on SQLite on the loop's own connection; on PostgreSQL awaited on its async driver,
        outside a transaction (one statement is its own snapshot: no BEGIN and COMMIT)."""
        if self._loop_reads is None:

            def read() -> list[Any]:
                with self.read_rows() as conn:
                    return fetch(conn, prepared, params)

            return await self.run_read(read)
        with _bounded(self.wait_s):
            return await self._loop_reads.rows(prepared, params)

    async def row_of(self, prepared: Prepared, param: str, key: Any) -> Any | None:
        """The row for ``key`` of a prebuilt read by keys on PostgreSQL (``param``: its list of
        keys; its first column: the key), None if there is none; concurrent reads of the same
        statement are merged (``LoopReads.row_of``)."""
        if self._loop_reads is None:
            raise NotImplementedError("reads merged by key are PostgreSQL's")
        with _bounded(self.wait_s):
            return await self._loop_reads.row_of(prepared, param, key)

    async def run_read(self, read: Callable[[], T]) -> T:
        """``read()`` where a hot read costs least: on SQLite on the event loop, on the loop's
        own connection (``reads_on_loop``); on PostgreSQL on a worker thread."""
        if self.reads_on_loop:
            with self._own_connection():
                return read()
        return await anyio.to_thread.run_sync(read)

    async def open_async(self) -> None:
        """Make the event loop's PostgreSQL connections for ``rows`` ahead of the first reads, a
        few, in the background (nothing on SQLite)."""
        if self._loop_reads is not None:
            await self._loop_reads.open(LOOP_KEPT)

    async def dispose_async(self) -> None:
        """Close the connections of ``rows`` on PostgreSQL (on the loop that made them)."""
        if self._loop_reads is not None:
            await self._loop_reads.close()

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        """A write transaction: commit on success, roll back on any error. Keep it short: no
        validation, no Ray call inside it."""
        changes, outer = Changes(), getattr(self._changes, "open", None)
        self._changes.open = changes
        try:
            with _bounded(self.wait_s), self._turn(), self._writers() as session, session.begin():
                yield session
                if self._before_commit:
                    session.flush()  # what the commit would write, told as well
                    if changes:
                        for tell in self._before_commit:
                            tell(session, changes)
        finally:
            self._changes.open = outer
        # After the commit, never before: a read that began before is then out of date.
        if changes:
            for listener in self._on_commit:
                listener(changes)

    def _record(
        self, _conn: Any, _cursor: Any, _sql: str, _params: Any, context: Any, _many: bool
    ) -> None:
        changes: Changes | None = getattr(self._changes, "open", None)
        if changes is None or context is None:  # no write open, or a prepared read
            return
        if context.isinsert or context.isupdate or context.isdelete:
            try:
                changes.record(context.invoked_statement, context.compiled_parameters)
            except Exception:  # a statement of a shape not foreseen fails no write
                log.exception("telling what a statement changed failed; every run counts")
                changes.everything = True

    @contextmanager
    def _turn(self) -> Iterator[None]:
        if self._write_turn is None:
            yield
            return
        if not self._write_turn.acquire(timeout=self.wait_s):
            raise DatabaseBusy(f"no turn to write within {self.wait_s:g} s")
        try:
            yield
        finally:
            self._write_turn.release()

    def dispose(self) -> None:
        self.engine.dispose()
        if self._own_engine is not None:
            self._own_engine.dispose()


def _refuse_writes(session: Session, _context: Any, _instances: Any) -> None:
    if session.new or session.dirty or session.deleted:
        raise RuntimeError("a read transaction must not write; use Database.transaction()")


@contextmanager
def _bounded(wait_s: float) -> Iterator[None]:
    """Waits for the database that ran out of time become ``DatabaseBusy``."""
    try:
        yield
    except sa_exc.TimeoutError as exc:  # no pooled connection within pool_timeout
        raise DatabaseBusy(f"no database connection within {wait_s:g} s") from exc
    except sa_exc.DBAPIError as exc:
        if exc.connection_invalidated:
            raise DatabaseBusy("the database connection was lost; it is being renewed") from exc
        if isinstance(exc, sa_exc.OperationalError) and _is_lock_wait(exc.orig):
            raise DatabaseBusy(f"the database stayed locked for {wait_s:g} s") from exc
        raise


def _is_lock_wait(orig: BaseException | None) -> bool:
    if isinstance(orig, sqlite3.OperationalError):
        return "locked" in str(orig) or "busy" in str(orig)
    # PostgreSQL: lock_not_available (lock_timeout).
    return getattr(orig, "sqlstate", None) == "55P03"

"""Engine, sessions, the transaction boundary, and migrations to head."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

import migrations

MIGRATIONS_DIR = Path(migrations.__file__).parent


def make_engine(url: str) -> Engine:
    kwargs: dict[str, Any] = {"pool_pre_ping": True}
    if url.startswith("postgresql"):
        kwargs |= {"pool_size": 20, "max_overflow": 20}
    if url.startswith("sqlite"):
        # The driver's own transaction handling is off; we BEGIN IMMEDIATE ourselves so that a
        # transaction that reads and then writes never fails on a lock upgrade.
        kwargs["connect_args"] = {
            "check_same_thread": False,
            "timeout": 30,
            "isolation_level": None,
        }
    engine = create_engine(url, **kwargs)
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", _sqlite_pragmas)
        event.listen(engine, "begin", lambda conn: conn.exec_driver_sql("BEGIN IMMEDIATE"))
    return engine


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    # WAL lets readers run beside the one writer; FKs are off by default in SQLite.
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.close()


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
    """Owns the engine and the transaction boundary: ``with db.transaction() as s: ...``."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = make_engine(url)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        # SQLite has one writer at a time; queueing threads here is fairer and faster than
        # letting them sleep in SQLite's busy handler. Other processes still meet busy_timeout.
        # A plain Lock (not RLock): FastAPI may close a dependency in another thread than
        # the one that opened it. Transactions never nest.
        self._sqlite_lock = threading.Lock() if self.engine.dialect.name == "sqlite" else None

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        """One transaction: commit on success, roll back on any error."""
        with self._sqlite_lock or nullcontext(), self._sessions() as session, session.begin():
            yield session

    def dispose(self) -> None:
        self.engine.dispose()

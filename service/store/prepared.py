"""Prebuilt SELECTs run on the driver's own cursor, for the hottest reads (a run's page, a token
that signs in): there SQLAlchemy's execution of a statement (its context, events and result
object) costs several times what SQLite or psycopg spend on it. The statement stays SQLAlchemy
Core, compiled once per dialect, and its parameters and columns go through the same type
processors, so its rows equal ``Connection.execute``'s (tests/test_prepared.py); the engine's
``before_cursor_execute`` listeners see it. A driver error is raised as SQLAlchemy's, which
``db._bounded`` maps as any other (a lost connection is invalidated, or closed for its pool to
renew, and a 503 to retry).
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from psycopg import AsyncConnection
from sqlalchemy import Connection, Engine, Select
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeEngine

Processor = Callable[[Any], Any]


@dataclass
class _Compiled:
    sql: str
    positions: tuple[str, ...] | None  # the order of a positional paramstyle's parameters
    fixed: dict[str, Any]  # the statement's own values (literal binds), processed
    binds: Mapping[str, Processor]  # for the caller's values
    row: Callable[[Sequence[Any]], Any]
    dialect: Dialect
    types: tuple[TypeEngine[Any], ...]  # the columns' types for this dialect
    # The columns' result processors: some depend on the driver's type of the column, known
    # from the first cursor that ran the statement.
    results: tuple[Processor | None, ...] | None = None

    def parameters(self, params: dict[str, Any]) -> dict[str, Any] | list[Any]:
        given = {
            name: (self.binds[name](value) if name in self.binds else value)
            for name, value in params.items()
        }
        values = self.fixed | given
        return values if self.positions is None else [values[n] for n in self.positions]

    def rows(self, raw: Sequence[Sequence[Any]], cursor: Any) -> list[Any]:
        if self.results is None:  # (psycopg builds a cursor's description on each ask)
            self.results = tuple(
                t.result_processor(self.dialect, d[1])
                for t, d in zip(self.types, cursor.description, strict=True)
            )
        make = self.row
        if not any(self.results):
            return [make(r) for r in raw]
        results = self.results
        return [
            make([v if f is None else f(v) for f, v in zip(results, r, strict=True)]) for r in raw
        ]


class Prepared:
    """A Core SELECT (its columns named), its rows read on the driver's cursor: tuples whose
    fields are the columns' names, like ``Row``'s attributes."""

    def __init__(self, statement: Select[*tuple[Any, ...]]) -> None:
        self.statement = statement
        self._by_dialect: dict[type[Dialect], _Compiled] = {}

    def compiled(self, dialect: Dialect) -> _Compiled:
        done = self._by_dialect.get(type(dialect))  # (psycopg's sync and async dialects differ)
        if done is None:
            done = self._by_dialect[type(dialect)] = self._compile(dialect)
        return done

    def _compile(self, dialect: Dialect) -> _Compiled:
        compiled = self.statement.compile(dialect=dialect)
        if compiled.escaped_bind_names:
            raise ValueError("parameter names that need escaping are not supported")
        binds = {
            name: processor
            for name, bind in compiled.binds.items()
            if (processor := bind.type.dialect_impl(dialect).bind_processor(dialect))
        }
        fixed = {
            name: binds[name](bind.effective_value) if name in binds else bind.effective_value
            for name, bind in compiled.binds.items()
            if not bind.required
        }
        columns = list(self.statement.selected_columns)
        names = [str(c.key) for c in columns]
        row: Any = namedtuple("PreparedRow", names)  # type: ignore[misc]
        return _Compiled(
            sql=compiled.string,
            positions=tuple(compiled.positiontup) if compiled.positiontup is not None else None,
            fixed=fixed,
            binds=binds,
            row=row._make,
            dialect=dialect,
            types=tuple(c.type.dialect_impl(dialect) for c in columns),
        )


@dataclass(frozen=True)
class DriverConnection:
    """A driver's own connection in a transaction opened on it (the event loop's SQLite
    connection, ``Database.read_rows``), and the engine whose dialect compiles for it and whose
    statement listeners are told."""

    driver: Any
    engine: Engine


# What the rows of a read transaction are fetched on.
RowsConnection = Connection | DriverConnection


def fetch(conn: RowsConnection, prepared: Prepared, params: dict[str, Any]) -> list[Any]:
    """The rows of ``prepared`` on ``conn``, in its transaction."""
    pooled: Connection | None
    if isinstance(conn, DriverConnection):
        pooled, engine = None, conn.engine
        dialect, events, driver = engine.dialect, engine.dispatch, conn.driver
    else:
        pooled, dialect, events = conn, conn.dialect, conn.dispatch
        driver = conn.connection.driver_connection
    compiled = prepared.compiled(dialect)
    cursor = driver.cursor()
    try:
        parameters = compiled.parameters(params)
        _told(events, pooled, cursor, compiled, parameters)
        cursor.execute(compiled.sql, parameters)
        return compiled.rows(cursor.fetchall(), cursor)
    except dialect.loaded_dbapi.Error as exc:
        lost = False
        if pooled is not None and dialect.is_disconnect(
            exc, pooled.connection.dbapi_connection, cursor
        ):
            lost = True
            pooled.invalidate(exc)  # not handed back to the pool, as SQLAlchemy's own execution
        raise _wrapped(compiled, exc, dialect, lost) from exc
    finally:
        cursor.close()


async def fetch_async(
    conn: AsyncConnection[Any], engine: Engine, prepared: Prepared, params: dict[str, Any]
) -> list[Any]:
    """The rows of ``prepared`` on ``conn`` (psycopg's async driver, a connection to ``engine``'s
    database in autocommit), compiled by ``engine``'s dialect, seen by its statement listeners.
    A lost connection is closed: its pool renews it."""
    dialect = engine.dialect
    compiled = prepared.compiled(dialect)
    try:
        async with conn.cursor() as cursor:
            parameters = compiled.parameters(params)
            _told(engine.dispatch, None, cursor, compiled, parameters)
            await cursor.execute(compiled.sql, parameters)
            return compiled.rows(await cursor.fetchall(), cursor)
    except dialect.loaded_dbapi.Error as exc:
        lost = conn.broken or conn.closed  # what the dialect's ``is_disconnect`` asks of psycopg
        if lost:
            await conn.close()
        raise _wrapped(compiled, exc, dialect, lost) from exc


def _told(
    events: Any, conn: Connection | None, cursor: Any, compiled: _Compiled, parameters: Any
) -> None:
    """The engine's statement listeners (tracing, counting) see this statement as any other
    (with no execution context)."""
    if events.before_cursor_execute:
        events.before_cursor_execute(conn, cursor, compiled.sql, parameters, None, False)


def _wrapped(
    compiled: _Compiled, exc: Exception, dialect: Dialect, lost: bool
) -> sa_exc.StatementError:
    return sa_exc.DBAPIError.instance(
        compiled.sql,
        None,
        exc,
        dialect.loaded_dbapi.Error,
        hide_parameters=True,
        connection_invalidated=lost,
        dialect=dialect,
    )

"""The backend's INSERT: SQLite's and PostgreSQL's both have ``on_conflict_do_nothing``."""

from __future__ import annotations

from typing import Any

from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session


def dialect_insert(session: Session) -> Any:
    """The backend's INSERT (it has ``on_conflict_do_nothing`` on SQLite and PostgreSQL)."""
    dialect = session.get_bind().dialect.name
    return postgresql.insert if dialect == "postgresql" else sqlite.insert

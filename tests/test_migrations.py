"""Alembic: upgrade, downgrade and upgrade again on SQLite and PostgreSQL; models match."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect

from service.store.db import downgrade, upgrade
from service.store.models import Base


def _tables(url: str) -> set[str]:
    engine = create_engine(url)
    names = set(inspect(engine).get_table_names()) - {"alembic_version"}
    engine.dispose()
    return names


def test_upgrade_downgrade_upgrade_round_trips(db_url: str) -> None:
    upgrade(db_url)
    assert _tables(db_url) == set(Base.metadata.tables)
    downgrade(db_url, "base")
    assert _tables(db_url) == set()
    upgrade(db_url)
    assert _tables(db_url) == set(Base.metadata.tables)


def test_models_match_the_migrations(db_url: str) -> None:
    upgrade(db_url)
    engine = create_engine(db_url)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    engine.dispose()
    assert diff == []

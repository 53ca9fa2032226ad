"""run_samples' text filter (``q``) reads trigram indexes on PostgreSQL, where pg_trgm can be had

Revision ID: 0029
Revises: 0028
Create Date: 2026-12-06

``CREATE EXTENSION pg_trgm`` needs the CREATE privilege on the database (pg_trgm is a trusted
extension: no superuser) and PostgreSQL's contrib modules installed. Where either is missing the
migration goes on without the indexes, says so, and the filter scans the run's samples as
before. SQLite: nothing (its filter scans).
"""

import logging
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0029"
down_revision: str | None = "0028"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Also in service.store.models.TEXT_SEARCH_INDEXES (migrations never import the models).
INDEXES = {"ix_run_samples_input_trgm": "input", "ix_run_samples_output_trgm": "output"}


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    try:
        with bind.begin_nested():  # a savepoint: a refusal leaves the migration's transaction
            bind.exec_driver_sql("CREATE EXTENSION IF NOT EXISTS pg_trgm")
    except sa.exc.DBAPIError as exc:
        reason = str(exc.orig).splitlines()[0]
        logging.getLogger("alembic.runtime.migration").warning(
            "pg_trgm is not available (%s): the samples' text filter scans a run's samples",
            reason,
        )
        return
    for name, column in INDEXES.items():
        op.create_index(
            name,
            "run_samples",
            [column],
            postgresql_using="gin",
            postgresql_ops={column: "gin_trgm_ops"},
        )


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for name in INDEXES:
        op.drop_index(name, table_name="run_samples", if_exists=True)

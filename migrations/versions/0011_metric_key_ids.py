"""metric keys with integer ids (and their latest values); points and tiers keyed by key id,
without a foreign key of their own

Revision ID: 0011
Revises: 0009
Create Date: 2026-12-01
"""

from collections.abc import Callable, Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _keys_table() -> None:
    op.create_table(
        "metric_keys",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("key", sa.String(length=200), nullable=False),
        sa.Column("first_step", sa.BigInteger(), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("value", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("run_id", "key", name="uq_metric_keys_run_key"),
        sqlite_autoincrement=True,
    )


def _points_table(by_id: bool) -> None:
    if by_id:
        columns = [
            sa.Column("key_id", sa.Integer(), autoincrement=False, nullable=False),
            sa.Column("step", sa.BigInteger(), nullable=False),
            sa.Column("value", sa.Float(), nullable=True),
            sa.Column("log_offset", sa.BigInteger(), nullable=False),
            sa.Column("run_id", sa.String(length=40), nullable=False),
            sa.PrimaryKeyConstraint("key_id", "step"),
        ]
    else:
        columns = [
            sa.Column("run_id", sa.String(length=40), nullable=False),
            sa.Column("key", sa.String(length=200), nullable=False),
            sa.Column("step", sa.BigInteger(), nullable=False),
            sa.Column("value", sa.Float(), nullable=True),
            sa.Column("log_offset", sa.BigInteger(), nullable=False),
            sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE"),
            sa.PrimaryKeyConstraint("run_id", "key", "step"),
        ]
    op.create_table("metric_points", *columns, sqlite_with_rowid=False)
    op.create_index("ix_metric_points_run_offset", "metric_points", ["run_id", "log_offset"])


def _buckets_table(by_id: bool) -> None:
    if by_id:
        key = [sa.Column("key_id", sa.Integer(), autoincrement=False, nullable=False)]
        constraints = [sa.PrimaryKeyConstraint("key_id", "level", "bucket")]
    else:
        key = [
            sa.Column("run_id", sa.String(length=40), nullable=False),
            sa.Column("key", sa.String(length=200), nullable=False),
        ]
        constraints = [
            sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE"),
            sa.PrimaryKeyConstraint("run_id", "key", "level", "bucket"),
        ]
    op.create_table(
        "metric_buckets",
        *key,
        sa.Column("level", sa.SmallInteger(), nullable=False),
        sa.Column("bucket", sa.BigInteger(), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("min", sa.Float(), nullable=True),
        sa.Column("max", sa.Float(), nullable=True),
        sa.Column("last_step", sa.BigInteger(), nullable=False),
        sa.Column("last_value", sa.Float(), nullable=True),
        *constraints,
        sqlite_with_rowid=False,
    )


def _move(table: str, select: str, columns: str, create: Callable[[], None]) -> None:
    """Rebuild ``table`` in its other shape: its rows as ``select`` gives them (into a holding
    table), the old table dropped, the new one made by ``create``, the rows copied in."""
    op.execute(f"CREATE TABLE {table}_moving AS {select}")
    if table == "metric_points":
        op.drop_index("ix_metric_points_run_offset", table_name="metric_points")
    op.drop_table(table)
    create()
    op.execute(f"INSERT INTO {table} ({columns}) SELECT {columns} FROM {table}_moving")  # noqa: S608 (names of this module)
    op.drop_table(f"{table}_moving")


def upgrade() -> None:
    _keys_table()
    op.execute(
        "INSERT INTO metric_keys (run_id, key, first_step, step, value)"
        " SELECT run_id, key, first_step, step, value FROM metric_latest ORDER BY run_id, key"
    )
    _move(
        "metric_points",
        "SELECT k.id AS key_id, p.step, p.value, p.log_offset, p.run_id FROM metric_points p"
        " JOIN metric_keys k ON k.run_id = p.run_id AND k.key = p.key",
        "key_id, step, value, log_offset, run_id",
        lambda: _points_table(True),
    )
    _move(
        "metric_buckets",
        "SELECT k.id AS key_id, b.level, b.bucket, b.count, b.min, b.max, b.last_step,"
        " b.last_value FROM metric_buckets b"
        " JOIN metric_keys k ON k.run_id = b.run_id AND k.key = b.key",
        "key_id, level, bucket, count, min, max, last_step, last_value",
        lambda: _buckets_table(True),
    )
    op.drop_table("metric_latest")


def downgrade() -> None:
    op.create_table(
        "metric_latest",
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("key", sa.String(length=200), nullable=False),
        sa.Column("first_step", sa.BigInteger(), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("value", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", "key"),
        sqlite_with_rowid=False,
    )
    op.execute(
        "INSERT INTO metric_latest (run_id, key, first_step, step, value)"
        " SELECT run_id, key, first_step, step, value FROM metric_keys"
    )
    _move(
        "metric_points",
        "SELECT k.run_id, k.key, p.step, p.value, p.log_offset FROM metric_points p"
        " JOIN metric_keys k ON k.id = p.key_id",
        "run_id, key, step, value, log_offset",
        lambda: _points_table(False),
    )
    _move(
        "metric_buckets",
        "SELECT k.run_id, k.key, b.level, b.bucket, b.count, b.min, b.max, b.last_step,"
        " b.last_value FROM metric_buckets b JOIN metric_keys k ON k.id = b.key_id",
        "run_id, key, level, bucket, count, min, max, last_step, last_value",
        lambda: _buckets_table(False),
    )
    op.drop_table("metric_keys")

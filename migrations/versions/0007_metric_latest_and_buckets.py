"""metric latest values and history tiers, filled from the stored points; SQLite points
without rowid

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The tiers' levels at this revision (bucket width 2**level steps).
LEVELS = (4, 6, 8, 10, 12)


def upgrade() -> None:
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
    op.create_table(
        "metric_buckets",
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("key", sa.String(length=200), nullable=False),
        sa.Column("level", sa.SmallInteger(), nullable=False),
        sa.Column("bucket", sa.BigInteger(), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("min", sa.Float(), nullable=True),
        sa.Column("max", sa.Float(), nullable=True),
        sa.Column("last_step", sa.BigInteger(), nullable=False),
        sa.Column("last_value", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", "key", "level", "bucket"),
        sqlite_with_rowid=False,
    )
    _points_with_rowid(False)
    op.execute(
        "INSERT INTO metric_latest (run_id, key, first_step, step, value) "
        "SELECT run_id, key, first_step, step, value FROM ("
        " SELECT run_id, key, step, value, min(step) OVER (PARTITION BY run_id, key) AS first_step,"
        " row_number() OVER (PARTITION BY run_id, key ORDER BY step DESC) AS rn"
        " FROM metric_points) AS t WHERE rn = 1"
    )
    for level in LEVELS:
        op.execute(_BUCKETS.format(level=level, width=2**level))


# Each (run, key, step // width)'s count, min, max and last point, from the stored points.
_BUCKETS = (
    "INSERT INTO metric_buckets"
    " (run_id, key, level, bucket, count, min, max, last_step, last_value)"
    " SELECT run_id, key, {level}, step / {width}, n, lo, hi, step, value FROM ("
    "  SELECT run_id, key, step, value,"
    "  count(*) OVER (PARTITION BY run_id, key, step / {width}) AS n,"
    "  min(value) OVER (PARTITION BY run_id, key, step / {width}) AS lo,"
    "  max(value) OVER (PARTITION BY run_id, key, step / {width}) AS hi,"
    "  row_number() OVER (PARTITION BY run_id, key, step / {width} ORDER BY step DESC) AS rn"
    "  FROM metric_points) AS t WHERE rn = 1"
)


def _points_with_rowid(with_rowid: bool) -> None:
    """On SQLite, metric points live in their primary key's b-tree (copied over once)."""
    if op.get_bind().dialect.name == "sqlite":
        with op.batch_alter_table(
            "metric_points", recreate="always", table_kwargs={"sqlite_with_rowid": with_rowid}
        ):
            pass


def downgrade() -> None:
    _points_with_rowid(True)
    op.drop_table("metric_buckets")
    op.drop_table("metric_latest")

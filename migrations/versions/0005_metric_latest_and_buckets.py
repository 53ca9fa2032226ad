"""metric latest values and history tiers, filled from the stored points

Revision ID: 0005
Revises: 0003
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The tiers' levels at this revision (bucket width 2**level steps).
LEVELS = (4, 6, 8, 10, 12)


def upgrade() -> None:
    op.create_table(
        "metric_latest",
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("key", sa.String(length=200), nullable=False),
        sa.Column("first_step", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("value", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", "key"),
    )
    op.create_table(
        "metric_buckets",
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("key", sa.String(length=200), nullable=False),
        sa.Column("level", sa.SmallInteger(), nullable=False),
        sa.Column("bucket", sa.Integer(), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("min", sa.Float(), nullable=True),
        sa.Column("max", sa.Float(), nullable=True),
        sa.Column("last_step", sa.Integer(), nullable=False),
        sa.Column("last_value", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", "key", "level", "bucket"),
    )
    op.execute(
        "INSERT INTO metric_latest (run_id, key, first_step, step, value) "
        "SELECT run_id, key, first_step, step, value FROM ("
        " SELECT run_id, key, step, value, min(step) OVER (PARTITION BY run_id, key) AS first_step,"
        " row_number() OVER (PARTITION BY run_id, key ORDER BY step DESC) AS rn"
        " FROM metric_points) AS t WHERE rn = 1"
    )
    for level in LEVELS:
        part = f"PARTITION BY run_id, key, step / {2**level}"
        op.execute(
            "INSERT INTO metric_buckets"
            " (run_id, key, level, bucket, count, min, max, last_step, last_value) "
            f"SELECT run_id, key, {level}, step / {2**level}, n, lo, hi, step, value FROM ("
            f" SELECT run_id, key, step, value, count(*) OVER ({part}) AS n,"
            f" min(value) OVER ({part}) AS lo, max(value) OVER ({part}) AS hi,"
            f" row_number() OVER ({part} ORDER BY step DESC) AS rn"
            " FROM metric_points) AS t WHERE rn = 1"
        )


def downgrade() -> None:
    op.drop_table("metric_buckets")
    op.drop_table("metric_latest")

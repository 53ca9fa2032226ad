"""per-run counts of stored metric keys and points, filled from the latest values and tiers

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("run_logs", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("metric_keys", sa.Integer(), server_default="0", nullable=False)
        )
        batch_op.add_column(
            sa.Column("metric_points", sa.BigInteger(), server_default="0", nullable=False)
        )
    op.execute(
        "UPDATE run_logs SET"
        " metric_keys = (SELECT count(*) FROM metric_latest l WHERE l.run_id = run_logs.run_id),"
        # Points from the coarsest tier (2^12 steps): each point is in exactly one of its buckets.
        " metric_points = (SELECT coalesce(sum(b.count), 0) FROM metric_buckets b"
        "  WHERE b.run_id = run_logs.run_id AND b.level = 12)"
    )


def downgrade() -> None:
    with op.batch_alter_table("run_logs", schema=None) as batch_op:
        batch_op.drop_column("metric_points")
        batch_op.drop_column("metric_keys")

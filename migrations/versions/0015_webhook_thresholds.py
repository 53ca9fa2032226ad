"""where each metric.threshold rule of a subscription stands on each run (armed or fired)

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "webhook_thresholds",
        sa.Column("webhook_id", sa.String(length=40), nullable=False),
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("rule", sa.String(length=300), nullable=False),
        sa.Column("streak", sa.Integer(), nullable=False),
        sa.Column("last_step", sa.BigInteger(), nullable=False),
        sa.Column("fired", sa.Boolean(), nullable=False),
        sa.ForeignKeyConstraint(["webhook_id"], ["webhooks.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("webhook_id", "run_id", "rule"),
    )
    op.create_index("ix_webhook_thresholds_run_id", "webhook_thresholds", ["run_id"])


def downgrade() -> None:
    op.drop_table("webhook_thresholds")

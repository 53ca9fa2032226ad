"""accelerator-seconds per day and month, team, user, recipe and accelerator; who submitted each run

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("created_by", sa.String(length=200), nullable=True))
    op.create_table(
        "usage_totals",
        sa.Column("period", sa.String(length=1), nullable=False),
        sa.Column("start", sa.Date(), nullable=False),
        sa.Column("team", sa.String(length=64), nullable=False),
        sa.Column("user", sa.String(length=200), nullable=False),
        sa.Column("recipe", sa.String(length=64), nullable=False),
        sa.Column("accelerator", sa.String(length=8), nullable=False),
        sa.Column("accelerator_seconds", sa.Float(), nullable=False),
        sa.Column("runs", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("period", "start", "team", "user", "recipe", "accelerator"),
    )


def downgrade() -> None:
    op.drop_table("usage_totals")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("created_by")

"""accelerator-seconds per day and month, team and accelerator (summed over users and recipes)

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "usage_team_totals",
        sa.Column("period", sa.String(length=1), nullable=False),
        sa.Column("start", sa.Date(), nullable=False),
        sa.Column("team", sa.String(length=64), nullable=False),
        sa.Column("accelerator", sa.String(length=8), nullable=False),
        sa.Column("accelerator_seconds", sa.Float(), nullable=False),
        sa.Column("runs", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("period", "start", "team", "accelerator"),
    )
    # What the usage counted so far, summed the same way.
    op.execute(
        "INSERT INTO usage_team_totals"
        " (period, start, team, accelerator, accelerator_seconds, runs)"
        " SELECT period, start, team, accelerator, SUM(accelerator_seconds), SUM(runs)"
        " FROM usage_totals GROUP BY period, start, team, accelerator"
    )


def downgrade() -> None:
    op.drop_table("usage_team_totals")

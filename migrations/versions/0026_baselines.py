"""the baseline run of each team and recipe

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-06
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0026"
down_revision: str | None = "0025"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "baselines",
        sa.Column("team", sa.String(length=64), nullable=False),
        sa.Column("recipe", sa.String(length=64), nullable=False),
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("pinned_by", sa.String(length=200), nullable=False),
        sa.Column("pinned_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("team", "recipe"),
    )
    op.create_index("ix_baselines_run_id", "baselines", ["run_id"])


def downgrade() -> None:
    op.drop_index("ix_baselines_run_id", table_name="baselines")
    op.drop_table("baselines")

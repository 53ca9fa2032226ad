"""one-time grants a job redeems for its run's secrets (only the token's SHA-256 is stored)

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UTC = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "secret_grants",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("submission_id", sa.String(length=64), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", UTC, nullable=False),
        sa.Column("expires_at", UTC, nullable=False),
        sa.Column("redeemed_at", UTC, nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("token_hash"),
    )
    op.create_index("ix_secret_grants_run_id", "secret_grants", ["run_id"])


def downgrade() -> None:
    op.drop_index("ix_secret_grants_run_id", table_name="secret_grants")
    op.drop_table("secret_grants")

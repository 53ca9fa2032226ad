"""run_sample_steps: a run's per-step sample scores, kept by the ingest

Revision ID: 0028
Revises: 0027
Create Date: 2026-12-06
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0028"
down_revision: str | None = "0027"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "run_sample_steps",
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("score_sum", sa.Float(), nullable=False),
        sa.Column("min_score", sa.Float(), nullable=False),
        sa.Column("max_score", sa.Float(), nullable=False),
        sa.Column("of", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", "step"),
    )
    # What is held already, summed once.
    op.execute(
        "INSERT INTO run_sample_steps (run_id, step, count, score_sum, min_score, max_score, of) "
        "SELECT run_id, step, count(*), sum(score), min(score), max(score), max(of) "
        "FROM run_samples GROUP BY run_id, step"
    )


def downgrade() -> None:
    op.drop_table("run_sample_steps")

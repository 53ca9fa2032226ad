"""rollout samples kept per run, with their counters on run_logs

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-06
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0025"
down_revision: str | None = "0024"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "run_samples",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("prompt_id", sa.String(length=16), nullable=False),
        sa.Column("score", sa.Float(), nullable=False),
        sa.Column("input", sa.Text(), nullable=False),
        sa.Column("output", sa.Text(), nullable=False),
        sa.Column("gts", sa.Text(), nullable=False),
        sa.Column(
            "extras", sa.JSON().with_variant(postgresql.JSONB(), "postgresql"), nullable=False
        ),
        sa.Column("cut", sa.String(length=400), nullable=False),
        sa.Column("of", sa.Integer(), nullable=True),
        sa.Column("chars", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_run_samples_run_id", "run_samples", ["run_id", "id"])
    op.create_index("ix_run_samples_run_step", "run_samples", ["run_id", "step", "id"])
    op.create_index("ix_run_samples_run_prompt", "run_samples", ["run_id", "prompt_id", "id"])
    with op.batch_alter_table("run_logs", schema=None) as batch_op:
        for name in ("samples_kept", "samples_chars", "samples_skipped"):
            batch_op.add_column(
                sa.Column(name, sa.BigInteger(), server_default="0", nullable=False)
            )


def downgrade() -> None:
    with op.batch_alter_table("run_logs", schema=None) as batch_op:
        for name in ("samples_skipped", "samples_chars", "samples_kept"):
            batch_op.drop_column(name)
    op.drop_index("ix_run_samples_run_prompt", table_name="run_samples")
    op.drop_index("ix_run_samples_run_step", table_name="run_samples")
    op.drop_index("ix_run_samples_run_id", table_name="run_samples")
    op.drop_table("run_samples")

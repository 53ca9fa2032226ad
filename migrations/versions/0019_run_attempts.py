"""attempts of a run: the current attempt on the run, the ended ones in run_attempts

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("attempt", sa.Integer(), nullable=False, server_default="1"))
        batch_op.add_column(sa.Column("retry_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("resume", sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column("resumed_from_step", sa.BigInteger(), nullable=True))
    with op.batch_alter_table("run_events", schema=None) as batch_op:
        batch_op.add_column(sa.Column("attempt", sa.Integer(), nullable=True))
    with op.batch_alter_table("run_logs", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("log_base", sa.BigInteger(), nullable=False, server_default="0")
        )
    op.create_table(
        "run_attempts",
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column("ray_job_id", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("submitted_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("failure", _JSON, nullable=True),
        sa.Column("resumed_from_step", sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", "n"),
    )


def downgrade() -> None:
    op.drop_table("run_attempts")
    with op.batch_alter_table("run_logs", schema=None) as batch_op:
        batch_op.drop_column("log_base")
    with op.batch_alter_table("run_events", schema=None) as batch_op:
        batch_op.drop_column("attempt")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("resumed_from_step")
        batch_op.drop_column("resume")
        batch_op.drop_column("retry_at")
        batch_op.drop_column("attempt")

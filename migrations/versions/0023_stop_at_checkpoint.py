"""a run's checkpoints, a stop at its next one, its deadline; an event's kind and step

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-06
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0023"
down_revision: str | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_RUN_COLUMNS = (
    ("checkpoint_step", sa.BigInteger()),
    ("checkpoint_at", sa.DateTime(timezone=True)),
    ("checkpoint_every_s", sa.Float()),
    ("yield_by", sa.DateTime(timezone=True)),
    ("yield_after_step", sa.BigInteger()),
    ("yield_then", sa.String(length=16)),
    ("yield_reason", sa.Text()),
    ("stop_saved_step", sa.BigInteger()),
    ("stop_lost_steps", sa.BigInteger()),
    ("deadline_at", sa.DateTime(timezone=True)),
)


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        for name, type_ in _RUN_COLUMNS:
            batch_op.add_column(sa.Column(name, type_, nullable=True))
    with op.batch_alter_table("run_events", schema=None) as batch_op:
        batch_op.add_column(sa.Column("kind", sa.String(length=32), nullable=True))
        batch_op.add_column(sa.Column("step", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("run_events", schema=None) as batch_op:
        batch_op.drop_column("step")
        batch_op.drop_column("kind")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        for name, _ in reversed(_RUN_COLUMNS):
            batch_op.drop_column(name)

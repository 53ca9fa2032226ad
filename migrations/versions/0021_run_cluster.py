"""the cluster a run was admitted on; runs from before are on `default`

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("cluster", sa.String(length=63), nullable=True))
    # Every run so far was for the one cluster there was (a queued one goes there while it is
    # declared and up; elsewhere otherwise).
    op.execute("UPDATE runs SET cluster = 'default'")


def downgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("cluster")

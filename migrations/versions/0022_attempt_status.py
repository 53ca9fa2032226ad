"""how the current attempt ended while its run is RETRYING (the retry decision pending)

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-06
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("attempt_status", sa.String(length=16), nullable=True))


def downgrade() -> None:
    # A run still deciding ends as its attempt did: the status before RETRYING existed.
    op.execute(
        "UPDATE runs SET status = attempt_status WHERE status = 'RETRYING' "
        "AND attempt_status IS NOT NULL"
    )
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("attempt_status")

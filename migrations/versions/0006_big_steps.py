"""metric steps beyond 2^31

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _steps(to: sa.types.TypeEngine[int], was: sa.types.TypeEngine[int]) -> None:
    with op.batch_alter_table("metric_points", schema=None) as batch_op:
        batch_op.alter_column("step", existing_type=was, type_=to, existing_nullable=False)
    with op.batch_alter_table("run_logs", schema=None) as batch_op:
        batch_op.alter_column("last_step", existing_type=was, type_=to, existing_nullable=True)


def upgrade() -> None:
    _steps(sa.BigInteger(), sa.Integer())


def downgrade() -> None:
    _steps(sa.Integer(), sa.BigInteger())

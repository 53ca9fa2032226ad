"""run_samples' indexes carry what a page filters and the per-step scores read

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-06
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0027"
down_revision: str | None = "0026"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_run_samples_run_id_score", "run_samples", ["run_id", "id", "score"])
    op.drop_index("ix_run_samples_run_id", table_name="run_samples")
    op.create_index(
        "ix_run_samples_run_step_scores", "run_samples", ["run_id", "step", "id", "score", "of"]
    )
    op.drop_index("ix_run_samples_run_step", table_name="run_samples")


def downgrade() -> None:
    op.create_index("ix_run_samples_run_step", "run_samples", ["run_id", "step", "id"])
    op.drop_index("ix_run_samples_run_step_scores", table_name="run_samples")
    op.create_index("ix_run_samples_run_id", "run_samples", ["run_id", "id"])
    op.drop_index("ix_run_samples_run_id_score", table_name="run_samples")

"""evaluator breadth: an Evals run's count of items the judge could not grade, the id of the key
that started it and of the key minted to resume it after a restart; whose scores a re-score of
the top checkpoints is on (the judge's, or the deterministic graders')

Revision ID: e1f3a5b7c9d1
Revises: d0e2f4a6b8c0
Create Date: 2026-12-07 00:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "e1f3a5b7c9d1"
down_revision: str | Sequence[str] | None = "d0e2f4a6b8c0"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("evaluator_eval_runs", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("judge_errors", sa.Integer(), server_default="0", nullable=False)
        )
        batch_op.add_column(sa.Column("caller_key_id", sa.String(length=32), nullable=True))
        batch_op.add_column(sa.Column("resume_key_id", sa.String(length=32), nullable=True))
    with op.batch_alter_table("evaluator_rescores", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column(
                "grader", sa.String(length=16), server_default="deterministic", nullable=False
            )
        )


def downgrade() -> None:
    with op.batch_alter_table("evaluator_rescores", schema=None) as batch_op:
        batch_op.drop_column("grader")
    with op.batch_alter_table("evaluator_eval_runs", schema=None) as batch_op:
        batch_op.drop_column("resume_key_id")
        batch_op.drop_column("caller_key_id")
        batch_op.drop_column("judge_errors")

"""evaluator the serving version's score on a retrain job's eval split

Revision ID: c9d1e3f5a7b8
Revises: b8c0d2e4f6a7
Create Date: 2026-12-06 01:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "c9d1e3f5a7b8"
down_revision: str | Sequence[str] | None = "b8c0d2e4f6a7"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "evaluator_serving_baselines",
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("version_id", sa.String(length=64), nullable=False),
        sa.Column("version", sa.Integer(), nullable=True),
        sa.Column("model", sa.String(length=256), nullable=False),
        sa.Column("checkpoint_uri", sa.String(length=1024), nullable=False),
        sa.Column("score", sa.Float(), nullable=False),
        sa.Column("items", sa.Integer(), nullable=False),
        sa.Column("outputs_uri", sa.String(length=1024), nullable=False),
        sa.Column("duration_s", sa.Float(), nullable=False),
        sa.Column("scored_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint(
            "job_id", "version_id", name=op.f("pk_evaluator_serving_baselines")
        ),
    )


def downgrade() -> None:
    op.drop_table("evaluator_serving_baselines")

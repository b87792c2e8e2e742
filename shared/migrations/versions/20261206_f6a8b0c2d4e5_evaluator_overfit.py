"""evaluator overfit stop and re-scoring: each point's train loss, the job's early-stop request,
the top checkpoints' scores on the whole eval split

Revision ID: f6a8b0c2d4e5
Revises: e5f7a9b1c3d4
Create Date: 2026-12-06 00:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "f6a8b0c2d4e5"
down_revision: str | Sequence[str] | None = "e5f7a9b1c3d4"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("evaluator_points", schema=None) as batch_op:
        batch_op.add_column(sa.Column("train_loss", sa.Float(), nullable=True))
    with op.batch_alter_table("evaluator_jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("early_stop_reason", sa.String(length=1000), nullable=True))
        batch_op.add_column(
            sa.Column(
                "early_stop_published", sa.Boolean(), server_default=sa.false(), nullable=False
            )
        )
    op.create_table(
        "evaluator_rescores",
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("score", sa.Float(), nullable=False),
        sa.Column("items", sa.Integer(), nullable=False),
        sa.Column("outputs_uri", sa.String(length=1024), nullable=False),
        sa.Column("duration_s", sa.Float(), nullable=False),
        sa.Column("scored_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "step", name=op.f("pk_evaluator_rescores")),
    )


def downgrade() -> None:
    op.drop_table("evaluator_rescores")
    with op.batch_alter_table("evaluator_jobs", schema=None) as batch_op:
        batch_op.drop_column("early_stop_published")
        batch_op.drop_column("early_stop_reason")
    with op.batch_alter_table("evaluator_points", schema=None) as batch_op:
        batch_op.drop_column("train_loss")

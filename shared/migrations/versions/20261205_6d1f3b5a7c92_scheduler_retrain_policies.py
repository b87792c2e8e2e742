"""scheduler retrain policies: a tenant's rule for training the next version from new traffic

Revision ID: 6d1f3b5a7c92
Revises: 5b8e1d2c4f60
Create Date: 2026-12-05 22:40:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "6d1f3b5a7c92"
down_revision: str | Sequence[str] | None = "5b8e1d2c4f60"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "scheduler_retrain_policies",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("tenant", sa.String(length=63), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("spec", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("watermark", sa.DateTime(timezone=True), nullable=True),
        sa.Column("runs", sa.Integer(), nullable=False),
        sa.Column("last_run_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_dataset_id", sa.String(length=64), nullable=True),
        sa.Column("last_job_id", sa.String(length=64), nullable=True),
        sa.Column("last_error", sa.String(length=2000), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("tenant", "name"),
    )
    with op.batch_alter_table("scheduler_retrain_policies", schema=None) as batch_op:
        batch_op.create_index("ix_scheduler_retrain_policies_tenant", ["tenant"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("scheduler_retrain_policies", schema=None) as batch_op:
        batch_op.drop_index("ix_scheduler_retrain_policies_tenant")
    op.drop_table("scheduler_retrain_policies")

"""scheduler budgets and usage: each attempt's device, device count, price and trained tokens; a
job's max_cost; a tenant's monthly cost cap

Revision ID: 4a6d2e8f1b30
Revises: 3f1c2a9b7d10
Create Date: 2026-12-05 21:50:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "4a6d2e8f1b30"
down_revision: str | Sequence[str] | None = "3f1c2a9b7d10"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ATTEMPT_COLUMNS = ("device", "device_count", "cost_per_hour", "tokens_start", "tokens_last")


def upgrade() -> None:
    with op.batch_alter_table("scheduler_jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("max_cost", sa.Float(), nullable=True))
    with op.batch_alter_table("scheduler_attempts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("device", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("device_count", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("cost_per_hour", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("tokens_start", sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column("tokens_last", sa.BigInteger(), nullable=True))
    op.create_table(
        "scheduler_tenant_budgets",
        sa.Column("tenant", sa.String(length=63), nullable=False),
        sa.Column("monthly_cost_cap", sa.Float(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("tenant"),
    )


def downgrade() -> None:
    op.drop_table("scheduler_tenant_budgets")
    with op.batch_alter_table("scheduler_attempts", schema=None) as batch_op:
        for name in reversed(_ATTEMPT_COLUMNS):
            batch_op.drop_column(name)
    with op.batch_alter_table("scheduler_jobs", schema=None) as batch_op:
        batch_op.drop_column("max_cost")

"""scheduler attempts: number, resume point, steps, last report, stop request, failure; job priority

Revision ID: 3f1c2a9b7d10
Revises: 8b8b7ff6bcb2
Create Date: 2026-12-05 19:20:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "3f1c2a9b7d10"
down_revision: str | Sequence[str] | None = "8b8b7ff6bcb2"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_COLUMNS = (
    "number", "resume_from", "first_step", "last_step", "last_report_at", "stop_requested",
    "failure", "completed",
)  # fmt: skip


def upgrade() -> None:
    with op.batch_alter_table("scheduler_jobs", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("priority", sa.String(length=8), nullable=False, server_default="normal")
        )
    with op.batch_alter_table("scheduler_attempts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("number", sa.Integer(), nullable=False, server_default="1"))
        batch_op.add_column(sa.Column("resume_from", sa.String(length=1024), nullable=True))
        batch_op.add_column(sa.Column("first_step", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("last_step", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("last_report_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("stop_requested", sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column("failure", sa.String(length=32), nullable=True))
        batch_op.add_column(
            sa.Column("completed", sa.Boolean(), nullable=False, server_default=sa.false())
        )


def downgrade() -> None:
    with op.batch_alter_table("scheduler_jobs", schema=None) as batch_op:
        batch_op.drop_column("priority")
    with op.batch_alter_table("scheduler_attempts", schema=None) as batch_op:
        for name in reversed(_COLUMNS):
            batch_op.drop_column(name)

"""hoster served names: a stable name callers use, its primary version, a canary and its split,
the version it replaced (rollback), the automatic-rollback policy; each deployment's served name

Revision ID: 7e2a4c6b8d13
Revises: 6d1f3b5a7c92
Create Date: 2026-12-05 23:20:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "7e2a4c6b8d13"
down_revision: str | Sequence[str] | None = "6d1f3b5a7c92"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "hoster_served_names",
        sa.Column("tenant", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=256), nullable=False),
        sa.Column("primary_id", sa.String(length=64), nullable=True),
        sa.Column("canary_id", sa.String(length=64), nullable=True),
        sa.Column("canary_percent", sa.Float(), nullable=False),
        sa.Column("previous_id", sa.String(length=64), nullable=True),
        sa.Column("policy", sa.JSON(), nullable=False),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("tenant", "name"),
    )
    with op.batch_alter_table("hoster_deployments", schema=None) as batch_op:
        batch_op.add_column(sa.Column("served_name", sa.String(length=256), nullable=True))
        batch_op.add_column(sa.Column("role", sa.String(length=16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("hoster_deployments", schema=None) as batch_op:
        batch_op.drop_column("role")
        batch_op.drop_column("served_name")
    op.drop_table("hoster_served_names")

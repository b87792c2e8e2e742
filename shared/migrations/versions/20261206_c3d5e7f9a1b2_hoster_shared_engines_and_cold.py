"""hoster deployments: the engine each runs on (shared by a tenant's LoRA versions of one base)
and pinned (never unloaded for idling; others go cold)

Revision ID: c3d5e7f9a1b2
Revises: 9a4c6e8f0b35
Create Date: 2026-12-06 10:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "c3d5e7f9a1b2"
down_revision: str | Sequence[str] | None = "9a4c6e8f0b35"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("hoster_deployments", schema=None) as batch_op:
        batch_op.add_column(sa.Column("engine_id", sa.String(length=64), nullable=True))
        batch_op.add_column(
            sa.Column("pinned", sa.Boolean(), nullable=False, server_default=sa.false())
        )


def downgrade() -> None:
    # The old schema has no cold status: those deployments are started again as pending.
    op.execute("UPDATE hoster_deployments SET status = 'pending' WHERE status = 'cold'")
    with op.batch_alter_table("hoster_deployments", schema=None) as batch_op:
        batch_op.drop_column("pinned")
        batch_op.drop_column("engine_id")

"""hoster served names: a shadow deployment mirrored a share of the calls

Revision ID: 9a4c6e8f0b35
Revises: 8f3b5d7c9e24
Create Date: 2026-12-05 23:50:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "9a4c6e8f0b35"
down_revision: str | Sequence[str] | None = "8f3b5d7c9e24"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("hoster_served_names", schema=None) as batch_op:
        batch_op.add_column(sa.Column("shadow_id", sa.String(length=64), nullable=True))
        batch_op.add_column(
            sa.Column("shadow_percent", sa.Float(), nullable=False, server_default="0")
        )


def downgrade() -> None:
    with op.batch_alter_table("hoster_served_names", schema=None) as batch_op:
        batch_op.drop_column("shadow_percent")
        batch_op.drop_column("shadow_id")

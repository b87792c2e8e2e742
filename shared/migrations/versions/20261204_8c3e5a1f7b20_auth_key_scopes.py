"""auth: API key scopes (existing keys keep full rights: write)

Revision ID: 8c3e5a1f7b20
Revises: 5b7c0f2d9a41
Create Date: 2026-12-04 09:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "8c3e5a1f7b20"
down_revision: str | Sequence[str] | None = "5b7c0f2d9a41"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("auth_api_keys", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("scope", sa.String(length=16), server_default="write", nullable=False)
        )


def downgrade() -> None:
    with op.batch_alter_table("auth_api_keys", schema=None) as batch_op:
        batch_op.drop_column("scope")

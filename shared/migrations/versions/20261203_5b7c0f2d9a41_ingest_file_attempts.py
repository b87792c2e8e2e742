"""ingest file attempts, status index

Revision ID: 5b7c0f2d9a41
Revises: e1e1554cc9e8
Create Date: 2026-12-03 08:45:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "5b7c0f2d9a41"
down_revision: str | Sequence[str] | None = "e1e1554cc9e8"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("ingest_files", schema=None) as batch_op:
        batch_op.add_column(sa.Column("attempts", sa.Integer(), server_default="0", nullable=False))
        batch_op.create_index("ix_ingest_files_status", ["status"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("ingest_files", schema=None) as batch_op:
        batch_op.drop_index("ix_ingest_files_status")
        batch_op.drop_column("attempts")

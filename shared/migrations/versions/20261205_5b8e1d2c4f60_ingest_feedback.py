"""ingest feedback: scores, labels and comments on samples (POST /v1/feedback)

Revision ID: 5b8e1d2c4f60
Revises: 4a6d2e8f1b30
Create Date: 2026-12-05 22:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "5b8e1d2c4f60"
down_revision: str | Sequence[str] | None = "4a6d2e8f1b30"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # No foreign key to ingest_samples: feedback may come before the shipper stores its sample.
    op.create_table(
        "ingest_feedback",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("tenant", sa.String(length=63), nullable=False),
        sa.Column("sample_id", sa.String(length=64), nullable=False),
        sa.Column("score", sa.Float(), nullable=True),
        sa.Column("label", sa.String(length=64), nullable=True),
        sa.Column("comment", sa.String(length=2000), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ingest_feedback")),
    )
    with op.batch_alter_table("ingest_feedback", schema=None) as batch_op:
        batch_op.create_index(
            "ix_ingest_feedback_tenant_sample", ["tenant", "sample_id"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("ingest_feedback", schema=None) as batch_op:
        batch_op.drop_index("ix_ingest_feedback_tenant_sample")
    op.drop_table("ingest_feedback")

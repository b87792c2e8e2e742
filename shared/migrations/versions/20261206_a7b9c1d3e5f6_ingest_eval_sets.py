"""ingest eval sets refreshed from captured traffic, held out of training splits

Revision ID: a7b9c1d3e5f6
Revises: f6a8b0c2d4e5
Create Date: 2026-12-06 01:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "a7b9c1d3e5f6"
down_revision: str | Sequence[str] | None = "f6a8b0c2d4e5"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "ingest_eval_sets",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("tenant", sa.String(length=63), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("source", sa.LargeBinary(), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("meta", sa.LargeBinary(), nullable=True),
        sa.Column("latest_version", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("refreshed_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ingest_eval_sets")),
    )
    with op.batch_alter_table("ingest_eval_sets", schema=None) as batch_op:
        batch_op.create_index(
            "ix_ingest_eval_sets_tenant_created", ["tenant", "created_at", "id"], unique=False
        )
    op.create_table(
        "ingest_eval_set_versions",
        sa.Column("eval_set_id", sa.String(length=40), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("tenant", sa.String(length=63), nullable=False),
        sa.Column("item_count", sa.Integer(), nullable=False),
        sa.Column("report", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("eval_set_id", "version", name=op.f("pk_ingest_eval_set_versions")),
    )
    op.create_table(
        "ingest_eval_set_items",
        sa.Column("eval_set_id", sa.String(length=40), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("tenant", sa.String(length=63), nullable=False),
        sa.Column("sample_id", sa.String(length=64), nullable=False),
        sa.Column("prompt_key", sa.String(length=32), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint(
            "eval_set_id", "version", "position", name=op.f("pk_ingest_eval_set_items")
        ),
    )
    with op.batch_alter_table("ingest_eval_set_items", schema=None) as batch_op:
        batch_op.create_index("ix_ingest_eval_set_items_tenant", ["tenant"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("ingest_eval_set_items", schema=None) as batch_op:
        batch_op.drop_index("ix_ingest_eval_set_items_tenant")
    op.drop_table("ingest_eval_set_items")
    op.drop_table("ingest_eval_set_versions")
    with op.batch_alter_table("ingest_eval_sets", schema=None) as batch_op:
        batch_op.drop_index("ix_ingest_eval_sets_tenant_created")
    op.drop_table("ingest_eval_sets")

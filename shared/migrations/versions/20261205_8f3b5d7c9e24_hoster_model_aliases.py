"""hoster model aliases: movable names (`production`, `candidate`, ...) for one version of a
tenant's ft: name; archived versions (`archived_at`)

Revision ID: 8f3b5d7c9e24
Revises: 7e2a4c6b8d13
Create Date: 2026-12-05 23:50:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "8f3b5d7c9e24"
down_revision: str | Sequence[str] | None = "7e2a4c6b8d13"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "hoster_model_aliases",
        sa.Column("tenant", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=256), nullable=False),
        sa.Column("alias", sa.String(length=64), nullable=False),
        sa.Column("version_id", sa.String(length=64), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        # No ondelete: a version an alias holds cannot be deleted, even by a racing request.
        sa.ForeignKeyConstraint(
            ["version_id"],
            ["hoster_model_versions.id"],
            name=op.f("fk_hoster_model_aliases_version_id_hoster_model_versions"),
        ),
        sa.PrimaryKeyConstraint("tenant", "name", "alias", name=op.f("pk_hoster_model_aliases")),
    )
    with op.batch_alter_table("hoster_model_aliases", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_hoster_model_aliases_version_id"), ["version_id"], unique=False
        )
    with op.batch_alter_table("hoster_model_versions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("archived_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("hoster_model_versions", schema=None) as batch_op:
        batch_op.drop_column("archived_at")
    with op.batch_alter_table("hoster_model_aliases", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_hoster_model_aliases_version_id"))
    op.drop_table("hoster_model_aliases")

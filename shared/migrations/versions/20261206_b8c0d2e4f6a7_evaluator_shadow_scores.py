"""evaluator shadow pair verdicts and per served name scores

The evaluator's shadow scoring (services/evaluator/shadow.py): the served names it knows have a
shadow, how far each tenant's pairs were read from ingest, one verdict per pair; and the
hoster's latest score of a served name's shadow (what promote reads).

Revision ID: b8c0d2e4f6a7
Revises: a7b9c1d3e5f6
Create Date: 2026-12-06 01:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "b8c0d2e4f6a7"
down_revision: str | Sequence[str] | None = "a7b9c1d3e5f6"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "evaluator_shadow_targets",
        sa.Column("tenant", sa.String(length=63), nullable=False),
        sa.Column("name", sa.String(length=256), nullable=False),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("primary_version", sa.String(length=256), nullable=True),
        sa.Column("shadow_version", sa.String(length=256), nullable=True),
        sa.Column("shadow_model", sa.String(length=256), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("tenant", "name", name=op.f("pk_evaluator_shadow_targets")),
    )
    op.create_table(
        "evaluator_shadow_cursors",
        sa.Column("tenant", sa.String(length=63), nullable=False),
        sa.Column("cursor", sa.String(length=512), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("tenant", name=op.f("pk_evaluator_shadow_cursors")),
    )
    op.create_table(
        "evaluator_shadow_verdicts",
        sa.Column("tenant", sa.String(length=63), nullable=False),
        sa.Column("pair_id", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=256), nullable=False),
        sa.Column("primary_version", sa.String(length=256), nullable=False),
        sa.Column("shadow_version", sa.String(length=256), nullable=False),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.Column("verdicts", sa.String(length=64), nullable=True),
        sa.Column("error", sa.String(length=2000), nullable=True),
        sa.Column("rubric", sa.String(length=128), nullable=False),
        sa.Column("judge_model", sa.String(length=256), nullable=True),
        sa.Column("captured_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("judged_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("tenant", "pair_id", name=op.f("pk_evaluator_shadow_verdicts")),
    )
    with op.batch_alter_table("evaluator_shadow_verdicts", schema=None) as batch_op:
        batch_op.create_index(
            "ix_evaluator_shadow_verdicts_score",
            ["tenant", "name", "primary_version", "shadow_version"],
            unique=False,
        )
    with op.batch_alter_table("hoster_served_names", schema=None) as batch_op:
        batch_op.add_column(sa.Column("shadow_score", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("hoster_served_names", schema=None) as batch_op:
        batch_op.drop_column("shadow_score")
    with op.batch_alter_table("evaluator_shadow_verdicts", schema=None) as batch_op:
        batch_op.drop_index("ix_evaluator_shadow_verdicts_score")
    op.drop_table("evaluator_shadow_verdicts")
    op.drop_table("evaluator_shadow_cursors")
    op.drop_table("evaluator_shadow_targets")

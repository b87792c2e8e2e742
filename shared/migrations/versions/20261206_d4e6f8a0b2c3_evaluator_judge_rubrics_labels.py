"""evaluator judge: rubrics (versioned), cached verdicts, judged jobs, human labels

Revision ID: d4e6f8a0b2c3
Revises: c3d5e7f9a1b2
Create Date: 2026-12-06 00:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "d4e6f8a0b2c3"
down_revision: str | Sequence[str] | None = "c3d5e7f9a1b2"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "evaluator_judge_rubrics",
        sa.Column("tenant", sa.String(length=63), nullable=False),
        sa.Column("dataset_version", sa.String(length=64), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.Column("note", sa.String(length=2000), nullable=True),
        sa.Column("judge_model", sa.String(length=256), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint(
            "tenant", "dataset_version", "version", name=op.f("pk_evaluator_judge_rubrics")
        ),
    )
    op.create_table(
        "evaluator_judge_verdicts",
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("tenant", sa.String(length=63), nullable=False),
        sa.Column("model", sa.String(length=256), nullable=False),
        sa.Column("rubric", sa.String(length=128), nullable=False),
        sa.Column("verdict", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_evaluator_judge_verdicts")),
    )
    op.create_table(
        "evaluator_judge_jobs",
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("tenant", sa.String(length=63), nullable=False),
        sa.Column("dataset_version", sa.String(length=64), nullable=False),
        sa.Column("model", sa.String(length=256), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_evaluator_judge_jobs")),
    )
    op.create_table(
        "evaluator_judge_labels",
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("tenant", sa.String(length=63), nullable=False),
        sa.Column("dataset_version", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("score", sa.Float(), nullable=False),
        sa.Column("note", sa.String(length=2000), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint(
            "job_id", "step", "position", name=op.f("pk_evaluator_judge_labels")
        ),
    )
    with op.batch_alter_table("evaluator_judge_labels", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_evaluator_judge_labels_dataset_version"),
            ["dataset_version"],
            unique=False,
        )


def downgrade() -> None:
    with op.batch_alter_table("evaluator_judge_labels", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_evaluator_judge_labels_dataset_version"))
    op.drop_table("evaluator_judge_labels")
    op.drop_table("evaluator_judge_jobs")
    op.drop_table("evaluator_judge_verdicts")
    op.drop_table("evaluator_judge_rubrics")

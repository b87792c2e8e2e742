"""evaluator Evals API: evals, runs, output items (filled by the Evals API work)

Revision ID: e5f7a9b1c3d4
Revises: d4e6f8a0b2c3
Create Date: 2026-12-06 00:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "e5f7a9b1c3d4"
down_revision: str | Sequence[str] | None = "d4e6f8a0b2c3"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "evaluator_evals",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("tenant", sa.String(length=63), nullable=False),
        sa.Column("name", sa.String(length=256), nullable=False),
        sa.Column("meta", sa.LargeBinary(), nullable=False),
        sa.Column("data_source_config", sa.LargeBinary(), nullable=False),
        sa.Column("testing_criteria", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_evaluator_evals")),
    )
    with op.batch_alter_table("evaluator_evals", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_evaluator_evals_tenant"), ["tenant"], unique=False)

    op.create_table(
        "evaluator_eval_runs",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("eval_id", sa.String(length=64), nullable=False),
        sa.Column("tenant", sa.String(length=63), nullable=False),
        sa.Column("name", sa.String(length=256), nullable=False),
        sa.Column("meta", sa.LargeBinary(), nullable=False),
        sa.Column("data_source", sa.LargeBinary(), nullable=False),
        sa.Column("model", sa.String(length=256), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("error_code", sa.String(length=64), nullable=True),
        sa.Column("error_message", sa.String(length=2000), nullable=True),
        sa.Column("items", sa.Integer(), nullable=False),
        sa.Column("passed", sa.Integer(), nullable=False),
        sa.Column("failed", sa.Integer(), nullable=False),
        sa.Column("errored", sa.Integer(), nullable=False),
        sa.Column("per_criteria", sa.LargeBinary(), nullable=False),
        sa.Column("usage", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_evaluator_eval_runs")),
    )
    with op.batch_alter_table("evaluator_eval_runs", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_evaluator_eval_runs_eval_id"), ["eval_id"], unique=False
        )
        batch_op.create_index(batch_op.f("ix_evaluator_eval_runs_tenant"), ["tenant"], unique=False)

    op.create_table(
        "evaluator_eval_output_items",
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("item", sa.LargeBinary(), nullable=False),
        sa.Column("sample", sa.LargeBinary(), nullable=True),
        sa.Column("results", sa.LargeBinary(), nullable=True),
        sa.Column("status", sa.String(length=8), nullable=False),
        sa.Column("graded_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("run_id", "position", name=op.f("pk_evaluator_eval_output_items")),
        sa.UniqueConstraint("id", name=op.f("uq_evaluator_eval_output_items_id")),
    )


def downgrade() -> None:
    op.drop_table("evaluator_eval_output_items")
    with op.batch_alter_table("evaluator_eval_runs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_evaluator_eval_runs_tenant"))
        batch_op.drop_index(batch_op.f("ix_evaluator_eval_runs_eval_id"))

    op.drop_table("evaluator_eval_runs")
    with op.batch_alter_table("evaluator_evals", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_evaluator_evals_tenant"))

    op.drop_table("evaluator_evals")

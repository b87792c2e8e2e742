"""scheduler notification rules, their deliveries (the outbox) and attempts; budget thresholds

A tenant's notification rules (which facts go to which URL, in which body format), one
delivery row per alert and rule (sent until delivered or given up, so nothing is lost when
the scheduler restarts), each attempt's answer, and the percentages of a tenant's monthly
training cap its spend has reached (each published once a month as
job.budget_threshold_reached).

Revision ID: d0e2f4a6b8c0
Revises: c9d1e3f5a7b8
Create Date: 2026-12-07 00:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "d0e2f4a6b8c0"
down_revision: str | Sequence[str] | None = "c9d1e3f5a7b8"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _when(name: str, nullable: bool = False) -> sa.Column[object]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "scheduler_notification_rules",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("tenant", sa.String(length=63), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("url", sa.String(length=2048), nullable=False),
        sa.Column("format", sa.String(length=8), nullable=False),
        sa.Column("spec", sa.LargeBinary(), nullable=False),
        sa.Column("secret_version", sa.Integer(), nullable=False),
        _when("created_at"),
        _when("updated_at"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("tenant", "name"),
    )
    op.create_index(
        "ix_scheduler_notification_rules_tenant", "scheduler_notification_rules", ["tenant"]
    )
    op.create_table(
        "scheduler_notification_deliveries",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("rule_id", sa.String(length=40), nullable=False),
        sa.Column("tenant", sa.String(length=63), nullable=False),
        sa.Column("event", sa.String(length=32), nullable=False),
        sa.Column("key", sa.String(length=200), nullable=False),
        sa.Column("url", sa.String(length=2048), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        _when("next_attempt_at", nullable=True),
        sa.Column("last_status_code", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.String(length=500), nullable=True),
        _when("created_at"),
        _when("delivered_at", nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("rule_id", "key"),
    )
    op.create_index(
        "ix_scheduler_notification_deliveries_due",
        "scheduler_notification_deliveries",
        ["status", "next_attempt_at"],
    )
    op.create_index(
        "ix_scheduler_notification_deliveries_rule_created",
        "scheduler_notification_deliveries",
        ["rule_id", "created_at"],
    )
    op.create_table(
        "scheduler_notification_attempts",
        sa.Column("id", sa.String(length=48), nullable=False),
        sa.Column("delivery_id", sa.String(length=40), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        _when("started_at"),
        sa.Column("duration_ms", sa.Float(), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("error", sa.String(length=500), nullable=True),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("delivery_id", "number"),
    )
    op.create_index(
        "ix_scheduler_notification_attempts_delivery_id",
        "scheduler_notification_attempts",
        ["delivery_id"],
    )
    op.create_table(
        "scheduler_budget_thresholds",
        sa.Column("tenant", sa.String(length=63), nullable=False),
        _when("period_start"),
        sa.Column("percent", sa.Integer(), nullable=False),
        sa.Column("spent", sa.Float(), nullable=False),
        sa.Column("cap", sa.Float(), nullable=False),
        _when("reached_at"),
        sa.PrimaryKeyConstraint("tenant", "period_start", "percent"),
    )


def downgrade() -> None:
    op.drop_table("scheduler_budget_thresholds")
    op.drop_index(
        "ix_scheduler_notification_attempts_delivery_id", "scheduler_notification_attempts"
    )
    op.drop_table("scheduler_notification_attempts")
    op.drop_index(
        "ix_scheduler_notification_deliveries_rule_created", "scheduler_notification_deliveries"
    )
    op.drop_index("ix_scheduler_notification_deliveries_due", "scheduler_notification_deliveries")
    op.drop_table("scheduler_notification_deliveries")
    op.drop_index("ix_scheduler_notification_rules_tenant", "scheduler_notification_rules")
    op.drop_table("scheduler_notification_rules")

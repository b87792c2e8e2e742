"""auth: tenants, API keys (hashed) and webhook nonces

Revision ID: 33f0a467b8a7
Revises:
Create Date: 2026-12-02 11:50:38.548731
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "33f0a467b8a7"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "auth_tenants",
        sa.Column("id", sa.String(length=63), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_auth_tenants")),
    )
    op.create_table(
        "auth_api_keys",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("tenant_id", sa.String(length=63), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("prefix", sa.String(length=8), nullable=False),
        sa.Column("key_hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["auth_tenants.id"],
            name=op.f("fk_auth_api_keys_tenant_id_auth_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_auth_api_keys")),
    )
    op.create_index(op.f("ix_auth_api_keys_prefix"), "auth_api_keys", ["prefix"], unique=True)
    op.create_index(op.f("ix_auth_api_keys_tenant_id"), "auth_api_keys", ["tenant_id"])
    op.create_table(
        "auth_webhook_nonces",
        sa.Column("nonce", sa.String(length=128), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("nonce", name=op.f("pk_auth_webhook_nonces")),
    )
    op.create_index(
        op.f("ix_auth_webhook_nonces_expires_at"), "auth_webhook_nonces", ["expires_at"]
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_auth_webhook_nonces_expires_at"), table_name="auth_webhook_nonces")
    op.drop_table("auth_webhook_nonces")
    op.drop_index(op.f("ix_auth_api_keys_tenant_id"), table_name="auth_api_keys")
    op.drop_index(op.f("ix_auth_api_keys_prefix"), table_name="auth_api_keys")
    op.drop_table("auth_api_keys")
    op.drop_table("auth_tenants")

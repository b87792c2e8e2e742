"""scheduler notification rules and deliveries (placeholder, filled by its change)

Revision ID: d0e2f4a6b8c0
Revises: c9d1e3f5a7b8
Create Date: 2026-12-07 00:00:00.000000
"""

from collections.abc import Sequence

revision: str = "d0e2f4a6b8c0"
down_revision: str | Sequence[str] | None = "c9d1e3f5a7b8"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass

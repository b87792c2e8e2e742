"""evaluator breadth: judge re-asks, run resume, eval-set versions (placeholder, filled by its change)

Revision ID: e1f3a5b7c9d1
Revises: d0e2f4a6b8c0
Create Date: 2026-12-07 00:00:00.000000
"""

from collections.abc import Sequence

revision: str = "e1f3a5b7c9d1"
down_revision: str | Sequence[str] | None = "d0e2f4a6b8c0"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass

"""evaluator shadow pair verdicts and per served name scores

Revision ID: b8c0d2e4f6a7
Revises: a7b9c1d3e5f6
Create Date: 2026-12-06 01:00:00.000000
"""

from collections.abc import Sequence

revision: str = "b8c0d2e4f6a7"
down_revision: str | Sequence[str] | None = "a7b9c1d3e5f6"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    pass  # placeholder: filled in by the change that needs the table


def downgrade() -> None:
    pass

"""evaluator the serving version's score on a retrain job's eval split

Revision ID: c9d1e3f5a7b8
Revises: b8c0d2e4f6a7
Create Date: 2026-12-06 01:00:00.000000
"""

from collections.abc import Sequence

revision: str = "c9d1e3f5a7b8"
down_revision: str | Sequence[str] | None = "b8c0d2e4f6a7"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    pass  # placeholder: filled in by the change that needs the table


def downgrade() -> None:
    pass

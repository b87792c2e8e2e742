"""ingest eval sets refreshed from captured traffic, held out of training splits

Revision ID: a7b9c1d3e5f6
Revises: f6a8b0c2d4e5
Create Date: 2026-12-06 01:00:00.000000
"""

from collections.abc import Sequence

revision: str = "a7b9c1d3e5f6"
down_revision: str | Sequence[str] | None = "f6a8b0c2d4e5"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    pass  # placeholder: filled in by the change that needs the table


def downgrade() -> None:
    pass

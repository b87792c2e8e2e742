"""Alembic migrations of the tuneloop schema (run them with `python -m shared.db upgrade`)."""

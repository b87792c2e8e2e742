"""Fixtures: database (filled by its owner)."""

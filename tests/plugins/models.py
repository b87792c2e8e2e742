"""Fixtures: models (filled by its owner)."""

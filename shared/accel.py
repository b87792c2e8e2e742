"""Moved to services.ingest.accel (ingest's, and opt-in). This alias goes as soon as
services/ingest/runtime.py imports `accel` from there: shared names no service."""

from services.ingest.accel import status

__all__ = ["status"]

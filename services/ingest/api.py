"""HTTP routes of the ingest service. Its resources arrive with #3 (gateway, upload, OTLP) and #4 (datasets)."""

from fastapi import APIRouter

router = APIRouter(prefix="/v1")

"""Wiring only: the ingest service's FastAPI app and its bus subscribers."""

from fastapi import FastAPI

from services.ingest import api, handlers
from shared.service import ServiceRuntime
from shared.settings import Settings

SERVICE = "ingest"


def create_app(settings: Settings | None = None) -> FastAPI:
    runtime = ServiceRuntime(SERVICE, settings)
    runtime.include_router(handlers.router)
    return runtime.build_app(
        api.router,
        summary="HTTP edge: the OpenAI/Anthropic/Gemini-compatible gateway, JSONL upload, OTLP trace receiver, sample store and dataset builder.",
    )

"""Wiring only: the ingest service's FastAPI app, its subscribers and its running parts."""

from fastapi import FastAPI

from services.ingest import api, handlers
from services.ingest.state import Ingest
from shared.service import ServiceRuntime
from shared.settings import Settings

SERVICE = "ingest"


def create_app(settings: Settings | None = None) -> FastAPI:
    runtime = ServiceRuntime(SERVICE, settings)
    ingest = Ingest.build(settings=runtime.settings, engine=runtime.engine, broker=runtime.broker)
    runtime.include_router(handlers.build_router(engine=runtime.engine, routes=ingest.routes))
    runtime.on_lifecycle(ingest.start, ingest.stop)
    app = runtime.build_app(
        api.router,
        summary="HTTP edge: the OpenAI/Anthropic/Gemini-compatible gateway, JSONL upload, OTLP trace receiver, sample store and dataset builder.",
    )
    app.state.ingest = ingest
    return app

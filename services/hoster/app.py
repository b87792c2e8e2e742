"""Wiring only: the hoster service's FastAPI app and its bus subscribers."""

from fastapi import FastAPI

from services.hoster import api, handlers
from shared.service import ServiceRuntime
from shared.settings import Settings

SERVICE = "hoster"


def create_app(settings: Settings | None = None) -> FastAPI:
    runtime = ServiceRuntime(SERVICE, settings)
    runtime.include_router(handlers.router)
    return runtime.build_app(
        api.router,
        summary="Model registry (versions, lineage, stages), deployments and inference engines behind OpenAI-compatible endpoints.",
    )

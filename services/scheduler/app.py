"""Wiring only: the scheduler service's FastAPI app and its bus subscribers."""

from fastapi import FastAPI

from services.scheduler import api, handlers
from shared.service import ServiceRuntime
from shared.settings import Settings

SERVICE = "scheduler"


def create_app(settings: Settings | None = None) -> FastAPI:
    runtime = ServiceRuntime(SERVICE, settings)
    runtime.include_router(handlers.router)
    return runtime.build_app(
        api.router,
        summary="Fine-tuning jobs API, dataset analysis into a recipe, the GPU priority ladder, attempts, rollover, recovery and the signed-webhook receiver.",
    )

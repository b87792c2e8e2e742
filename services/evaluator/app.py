"""Wiring only: the evaluator service's FastAPI app and its bus subscribers."""

from fastapi import FastAPI

from services.evaluator import api, handlers
from shared.service import ServiceRuntime
from shared.settings import Settings

SERVICE = "evaluator"


def create_app(settings: Settings | None = None) -> FastAPI:
    runtime = ServiceRuntime(SERVICE, settings)
    runtime.include_router(handlers.router)
    return runtime.build_app(
        api.router,
        summary="Mid-run task evals: generation on held-out data, the rubric judge, scores, best-checkpoint choice and the eval gate.",
    )

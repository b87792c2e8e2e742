"""Wiring only: the hoster service's FastAPI app, its bus subscribers and its running parts."""

from fastapi import FastAPI

from services.hoster import api, handlers
from services.hoster.errors import HosterError
from services.hoster.state import Hoster
from shared import bus
from shared.events import Event
from shared.service import ServiceRuntime
from shared.settings import Settings

SERVICE = "hoster"


def create_app(settings: Settings | None = None) -> FastAPI:
    runtime = ServiceRuntime(SERVICE, settings)

    async def publish(event: Event) -> None:
        await bus.publish(runtime.broker, event)

    hoster = Hoster.build(runtime.settings, runtime.engine, publish)
    runtime.include_router(handlers.build_router(hoster))
    runtime.on_lifecycle(hoster.start, hoster.stop)
    app = runtime.build_app(
        api.router,
        summary="Model registry (versions, lineage, aliases), deployments and inference engines behind OpenAI-compatible endpoints.",
    )
    app.add_exception_handler(HosterError, api.hoster_error)
    app.state.hoster = hoster
    return app

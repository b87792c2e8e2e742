"""Wiring only: the ingest service's FastAPI app, its subscribers and its running parts."""

from fastapi import FastAPI

from services.ingest import api, handlers, ui
from services.ingest.datasets.workers import DatasetWorker
from services.ingest.gateway.fastpath import ProxyEndpoints, ProxyRoutes, is_proxy_call
from services.ingest.runtime import Ingest
from shared import bus
from shared.events import Event
from shared.service import ServiceRuntime, prepare_worker
from shared.settings import Settings

SERVICE = "ingest"


def create_app(settings: Settings | None = None) -> FastAPI:
    runtime = ServiceRuntime(SERVICE, settings)
    ingest = Ingest.build(settings=runtime.settings, engine=runtime.engine, broker=runtime.broker)

    async def publish(event: Event) -> None:
        await bus.publish(runtime.broker, event)

    datasets = DatasetWorker(
        engine=runtime.engine,
        store=ingest.store,
        s3=runtime.settings.s3,
        publish=publish,
        settings=ingest.settings,
    )
    runtime.include_router(
        handlers.build_router(engine=runtime.engine, routes=ingest.routes, datasets=datasets)
    )
    runtime.on_lifecycle(ingest.start, ingest.stop)
    app = runtime.build_app(
        api.router,
        summary="HTTP edge: the OpenAI/Anthropic/Gemini-compatible gateway, JSONL upload, OTLP trace receiver, sample store and dataset builder.",
        untraced=is_proxy_call,
    )
    ui.install(app)  # the dashboard at /ui: services/ingest/ui, docs/dashboard.md
    # The proxied calls and /v1/traces (the table in proxy_routes.py, which api.py documents)
    # are answered ahead of FastAPI: by the HTTP protocol itself when served by
    # `python -m services.ingest`, else by the middleware.
    assert runtime.telemetry is not None
    endpoints = ProxyEndpoints(ingest.gateway, runtime.telemetry, ingest.traces)
    app.add_middleware(ProxyRoutes, endpoints=endpoints)
    app.state.proxy_endpoints = endpoints
    app.state.ingest = ingest
    app.state.datasets = datasets
    return app


def create_worker_app() -> FastAPI:
    """The factory `python -m services.ingest` serves (one app per worker process)."""
    prepare_worker(SERVICE)
    return create_app()

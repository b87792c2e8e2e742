"""Wiring only: the ingest service's parts, built here and started in order (stopped in reverse),
its FastAPI app and its subscribers."""

import httpx
from fastapi import FastAPI

from services.ingest import api, handlers, ui
from services.ingest.capture.fidelity import FidelityFlusher
from services.ingest.capture.journal import Journal, journal_dir
from services.ingest.capture.pipeline import CapturePipeline
from services.ingest.capture.shipper_child import ShipperChild
from services.ingest.capture.spill import spill_file
from services.ingest.capture.spill_watch import SpillWatch
from services.ingest.config import IngestSettings
from services.ingest.datasets.workers import DatasetWorker
from services.ingest.gateway import forwarding
from services.ingest.gateway.calls import Gateway
from services.ingest.gateway.fastpath import ProxyEndpoints, ProxyRoutes, is_proxy_call
from services.ingest.gateway.routing import RoutingTable, load_upstreams
from services.ingest.gateway.wake import Waker
from services.ingest.http.errors import IngestError
from services.ingest.otlp.traces import TraceReceiver
from services.ingest.otlp.workers import ExportMapper
from services.ingest.runtime import Ingest, Part, Publisher, Uploads, closing, storage
from shared.auth import CachedAuthenticator
from shared.service import ServiceRuntime, prepare_worker
from shared.settings import Settings
from shared.storage import ObjectStore

SERVICE = "ingest"


def create_app(settings: Settings | None = None) -> FastAPI:
    runtime = ServiceRuntime(SERVICE, settings)
    config, engine, bus = IngestSettings(), runtime.engine, Publisher(runtime.broker)
    store = ObjectStore.from_settings(runtime.settings.s3)
    routes = RoutingTable(load_upstreams(config.upstreams_file))

    # Uploads and OTLP exports are captured where they arrive; proxied calls are journaled by
    # the gateway and made into samples by its shipper, a child process (capture/shipper.py).
    pipeline = CapturePipeline(
        publish=bus.event,
        publish_many=bus.many,
        store=store,
        spill=spill_file(runtime.settings, config),
        can_publish=bus.connected,
    )
    journal = Journal(journal_dir(runtime.settings))
    gateway = Gateway(
        settings=config,
        routes=routes,
        authenticator=CachedAuthenticator(engine, ttl_s=config.auth_cache_ttl_s),
        capture=journal.append,
        report=bus.event,
        waker=Waker(
            client=httpx.AsyncClient(timeout=httpx.Timeout(60.0, connect=5.0)),
            hoster_url=config.service_url("hoster", runtime.settings),
            service_token=runtime.settings.auth.service_token.get_secret_value(),
            timeout_s=config.wake_timeout_s,
        ),
    )
    # OTLP exports -> samples, large ones in a pool of processes (otlp/workers.py).
    otlp = ExportMapper(
        config.otlp_processes, min_bytes=config.otlp_process_min_bytes, cpu_class=config.otlp_cpu
    )
    shipper, fidelity = ShipperChild(), FidelityFlusher(pipeline.fidelity, engine)
    uploads = Uploads(
        engine,
        store,
        pipeline,
        runtime.settings.app.data_dir.resolve() / "ingest" / "uploads",
        config,
    )
    ingest = Ingest(
        settings=config,
        engine=engine,
        store=store,
        pipeline=pipeline,
        gateway=gateway,
        uploads=uploads,
        fidelity=fidelity,
        services=forwarding.service_urls(runtime.settings, config),
        control_client=forwarding.control_client(),
    )
    datasets = DatasetWorker(
        engine=engine, store=store, s3=runtime.settings.s3, publish=bus.event, settings=config
    )
    runtime.include_router(handlers.build_router(engine=engine, routes=routes, datasets=datasets))

    spill_watch = SpillWatch(pipeline.spill, publish=bus.event, can_publish=bus.connected)
    started_in_order = [
        storage(store),
        closing(gateway.aclose, ingest.control_client.aclose, otlp.close),
    ]
    if config.persister == "inline":  # else persister processes do it (capture/persister.py)
        # sample.captured -> the sample store, in batches.
        persister = handlers.sample_persister(
            broker=runtime.broker,
            engine=engine,
            store=store,
            fidelity=pipeline.fidelity,
            max_retry_delay_s=runtime.settings.nats.max_retry_delay_s,
        )
        started_in_order.append(Part(persister.start, persister.stop))
    started_in_order += [
        # The spill file's backlog on /metrics, and capture.spilled once it is empty.
        Part(spill_watch.start, spill_watch.stop),
        Part(fidelity.start, fidelity.stop),  # stops after the pipeline: its last counts kept
        # The shipper stops after the journal's last line, and ships what is left.
        Part(shipper.start, closing(journal.close, shipper.stop).stop),
        Part(pipeline.start, pipeline.stop),
        Part(uploads.start, uploads.stop),
    ]
    for part in started_in_order:
        runtime.on_lifecycle(part.start, part.stop)

    app = runtime.build_app(
        api.router,
        summary="HTTP edge: the OpenAI/Anthropic/Gemini-compatible gateway, JSONL upload, OTLP trace receiver, sample store and dataset builder.",
        untraced=is_proxy_call,
    )
    app.add_exception_handler(IngestError, api.ingest_error)
    ui.install(app)  # the dashboard at /ui: services/ingest/ui, docs/dashboard.md
    # The proxied calls and /v1/traces (the table in gateway/routes.py, which gateway/documented.py documents)
    # are answered ahead of FastAPI: by the HTTP protocol itself when served by
    # `python -m services.ingest`, else by the middleware.
    assert runtime.telemetry is not None
    endpoints = ProxyEndpoints(gateway, runtime.telemetry, TraceReceiver(gateway, pipeline, otlp))
    app.add_middleware(ProxyRoutes, endpoints=endpoints)
    app.state.proxy_endpoints = endpoints
    app.state.ingest = ingest
    app.state.datasets = datasets
    return app


def create_worker_app() -> FastAPI:
    """The factory `python -m services.ingest` serves (one app per worker process)."""
    prepare_worker(SERVICE)
    return create_app()

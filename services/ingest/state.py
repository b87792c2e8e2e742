"""What the ingest process holds while it runs: routes, gateway, capture pipeline, object store."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import httpx
from faststream.nats import NatsBroker
from sqlalchemy.engine import Engine

from services.ingest.capture import SpillFile
from services.ingest.config import IngestSettings
from services.ingest.forwarding import service_urls
from services.ingest.gateway import Gateway
from services.ingest.pipeline import CapturePipeline
from services.ingest.routing import RoutingTable, load_upstreams
from shared import bus
from shared.auth import CachedAuthenticator
from shared.events import SampleCaptured
from shared.settings import Settings
from shared.storage import ObjectStore


@dataclass
class Ingest:
    settings: IngestSettings
    routes: RoutingTable
    store: ObjectStore
    pipeline: CapturePipeline
    gateway: Gateway
    # Control-plane calls relayed to the services that own them (forwarding.py).
    services: dict[str, str]
    control_client: httpx.AsyncClient

    @classmethod
    def build(cls, *, settings: Settings, engine: Engine, broker: NatsBroker) -> Ingest:
        ingest_settings = IngestSettings()
        routes = RoutingTable(load_upstreams(ingest_settings.upstreams_file))
        store = ObjectStore.from_settings(settings.s3)

        async def publish(event: SampleCaptured) -> None:
            await bus.publish(broker, event)

        def can_publish() -> bool:
            return broker.connection is not None and broker.connection.is_connected

        pipeline = CapturePipeline(
            publish=publish,
            store=store,
            spill=SpillFile(settings.app.data_dir.resolve() / "ingest" / "capture-spill.jsonl"),
            queue_size=ingest_settings.capture_queue_size,
            can_publish=can_publish,
        )
        gateway = Gateway(
            settings=ingest_settings,
            routes=routes,
            authenticator=CachedAuthenticator(engine, ttl_s=ingest_settings.auth_cache_ttl_s),
            capture=pipeline.submit,
        )
        control_client = httpx.AsyncClient(timeout=httpx.Timeout(60.0, connect=5.0))
        return cls(
            ingest_settings,
            routes,
            store,
            pipeline,
            gateway,
            service_urls(settings),
            control_client,
        )

    async def start(self) -> None:
        await asyncio.to_thread(self.store.wait_until_ready)
        await asyncio.to_thread(self.store.ensure_bucket)
        await self.pipeline.start()

    async def stop(self) -> None:
        await self.pipeline.stop()
        await self.gateway.aclose()
        await self.control_client.aclose()

"""Event subscribers of the ingest service.

- sample.captured -> the sample store (in batches, idempotently: a redelivered event is a no-op).
- deployment.ready / deployment.stopped -> the gateway's routing table, so a model the hoster
  deployed is served behind the same base URL.
"""

from __future__ import annotations

import asyncio
import logging

from faststream.nats import NatsRouter
from sqlalchemy.engine import Engine

from services.ingest.routing import RoutingTable
from services.ingest.samples import insert_samples
from shared import bus
from shared.db import session_scope
from shared.events import DeploymentReady, DeploymentStopped, SampleCaptured

SERVICE = "ingest"
log = logging.getLogger("tuneloop.ingest.handlers")


def build_router(*, engine: Engine, routes: RoutingTable) -> NatsRouter:
    router = NatsRouter()

    @bus.subscribe(router, SampleCaptured, service=SERVICE, batch=True, batch_size=256)
    async def persist_samples(events: list[SampleCaptured]) -> None:
        samples = [event.sample for event in events]

        def store() -> int:
            with session_scope(engine) as session:
                return insert_samples(session, samples)

        # The database call blocks; keep the event loop (and the gateway on it) free.
        new = await asyncio.to_thread(store)
        log.debug("persisted %d new of %d samples", new, len(samples))

    @bus.watch(router, DeploymentReady)
    async def route_deployment(event: DeploymentReady) -> None:
        routes.add_deployment(
            served_model_name=event.served_model_name,
            deployment_id=event.deployment_id,
            endpoint_url=event.endpoint_url,
        )
        log.info("routing %s to deployment %s", event.served_model_name, event.deployment_id)

    @bus.watch(router, DeploymentStopped)
    async def unroute_deployment(event: DeploymentStopped) -> None:
        routes.remove_deployment(
            served_model_name=event.served_model_name, deployment_id=event.deployment_id
        )

    return router

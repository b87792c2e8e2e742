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

    # One event per call, not FastStream's batch mode: with faststream 0.7.8 and nats-py 2.16
    # the batch fetch loop dies on a plain asyncio.TimeoutError from a partial batch (it catches
    # nats.errors.TimeoutError only) and the consumer stalls. The pull still fetches 32 at a time.
    @bus.subscribe(router, SampleCaptured, service=SERVICE)
    async def persist_sample(event: SampleCaptured) -> None:
        def store() -> int:
            with session_scope(engine) as session:
                return insert_samples(session, [event.sample])

        # The database call blocks; keep the event loop (and the gateway on it) free.
        await asyncio.to_thread(store)

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

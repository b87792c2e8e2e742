"""Event subscribers of the ingest service.

- sample.captured -> the sample store (in batches, idempotently: a redelivered event is a no-op).
- deployment.ready / deployment.stopped -> the gateway's routing table, so a model the hoster
  deployed is served behind the same base URL (its answers tagged with the version they came from).
- dataset.build_requested -> a dataset build (datasets/workers.py), one at a time, kept alive
  while it runs.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, get_args

from faststream.nats import NatsBroker, NatsRouter
from faststream.nats.annotations import NatsMessage
from sqlalchemy.engine import Engine

from services.ingest.capture.fidelity import Fidelity
from services.ingest.datasets.workers import DatasetWorker
from services.ingest.gateway.routing import RoutingTable
from services.ingest.samples.store import BadSampleEvent, insert_rows, resolve_row, row_from_event
from shared import bus
from shared.chat import Source
from shared.db import session_scope
from shared.events import (
    DatasetBuildRequested,
    DeploymentCold,
    DeploymentReady,
    DeploymentStopped,
    SampleCaptured,
    ServedNameChanged,
)
from shared.storage import ObjectNotFound, ObjectStore

SERVICE = "ingest"
SOURCES = frozenset(get_args(Source))
log = logging.getLogger("tuneloop.ingest.handlers")


def sample_persister(
    *,
    broker: NatsBroker,
    engine: Engine,
    store: ObjectStore,
    fidelity: Fidelity,
    max_retry_delay_s: float = 30.0,
) -> bus.BatchConsumer[dict[str, Any]]:
    """sample.captured -> the sample store, a batch (32 messages) per transaction: the durable
    consumer FastStream's one-event subscriber used (app.py starts and stops it). Rows are
    made from the event bytes (samples.row_from_event); an event that cannot be a row goes to
    the dead-letter stream and is counted in `fidelity` as dropped, with its reason. A failed
    insert (the database away, locked, slow) is retried with backoff for as long as it fails;
    inserts are idempotent by sample id, so a redelivered batch stores nothing twice. A sample
    published by reference is read from `store` first (object storage away: the batch is retried
    like a failed insert)."""

    def decode(data: bytes, subject: str) -> dict[str, Any]:
        try:
            return row_from_event(data, subject)
        except BadSampleEvent as exc:
            raise bus.PoisonMessage(str(exc)) from None

    def readable(row: dict[str, Any]) -> dict[str, Any] | None:
        try:
            return resolve_row(row, store.get_bytes)
        except (BadSampleEvent, ObjectNotFound) as exc:
            # Written before its event was published: gone or wrong means removed by hand.
            log.error("a sample published by reference cannot be stored: %s", exc)
            fidelity.count_dropped(row["tenant"], "unknown", f"sample by reference: {exc}")
            return None

    def insert(rows: list[dict[str, Any]]) -> int:
        ready = [row for row in map(readable, rows) if row is not None]
        with session_scope(engine) as session:
            return insert_rows(session, ready)

    async def persist(rows: list[dict[str, Any]]) -> None:
        # The database call blocks; keep the event loop (and the gateway on it) free.
        await asyncio.to_thread(insert, rows)

    def dead_lettered(subject: str, data: bytes, reason: str) -> None:
        tenant = subject.split(".")[1] if subject.count(".") >= 2 else "?"
        fidelity.count_dropped(tenant, _source_of(data), f"dead-lettered: {reason}")

    # A batch takes milliseconds; a short ack wait brings back sooner what a killed process
    # had fetched but not stored.
    # Messages are mostly bundles (up to bus.MAX_BUNDLE_BYTES, often dozens of samples): 32 of
    # them keep a fetch's memory bounded and a transaction at up to a few thousand rows.
    options = bus.BatchOptions(batch_size=32, ack_wait_s=30.0, max_retry_delay_s=max_retry_delay_s)
    return bus.consume_batches(
        broker,
        SampleCaptured,
        service=SERVICE,
        decode=decode,
        handle=persist,
        options=options,
        on_dead_letter=dead_lettered,
    )


def _source_of(data: bytes) -> str:
    """The sample's source for the fidelity report, if the event says one it may take."""
    try:
        source = json.loads(data)["sample"]["source"]
    except Exception:  # the event is what could not be read
        return "unknown"
    return source if source in SOURCES else "unknown"


def build_router(
    *, engine: Engine, routes: RoutingTable, datasets: DatasetWorker | None = None
) -> NatsRouter:
    router = NatsRouter()

    @bus.watch(router, DeploymentReady)
    async def route_deployment(event: DeploymentReady) -> None:
        routes.add_deployment(
            tenant=event.tenant,
            served_model_name=event.served_model_name,
            deployment_id=event.deployment_id,
            endpoint_url=event.endpoint_url,
            version_id=event.version_id,
            cold=event.cold,
        )
        log.info(
            "routing %s of tenant %s to deployment %s (version %s)",
            event.served_model_name,
            event.tenant,
            event.deployment_id,
            event.version_id,
        )

    @bus.watch(router, ServedNameChanged)
    async def route_served_name(event: ServedNameChanged) -> None:
        routes.set_served(event)
        log.info(
            "served name %s of tenant %s (revision %d): primary %s, canary %s at %g %%",
            event.name, event.tenant, event.revision,
            event.primary.deployment_id if event.primary else None,
            event.canary.deployment_id if event.canary else None, event.canary_percent,
        )  # fmt: skip

    @bus.watch(router, DeploymentCold)
    async def cold_deployment(event: DeploymentCold) -> None:
        routes.mark_cold(event.deployment_id)
        log.info("deployment %s of tenant %s is cold: its next call wakes it",
                 event.deployment_id, event.tenant)  # fmt: skip

    @bus.watch(router, DeploymentStopped)
    async def unroute_deployment(event: DeploymentStopped) -> None:
        routes.remove_deployment(
            tenant=event.tenant,
            served_model_name=event.served_model_name,
            deployment_id=event.deployment_id,
        )

    if datasets is not None:
        _subscribe_dataset_builds(router, datasets)
    return router


def _subscribe_dataset_builds(router: NatsRouter, worker: DatasetWorker) -> None:
    max_deliver = worker.settings.dataset_max_deliver

    # One message per fetch: a second one waiting in the client behind a long build would pass
    # its ack_wait there and be redelivered to another instance while this one still holds it.
    @bus.subscribe(
        router,
        DatasetBuildRequested,
        service=SERVICE,
        ack_wait_s=worker.ack_wait_s,
        max_deliver=max_deliver,
        batch_size=1,
    )
    async def build_dataset(event: DatasetBuildRequested, msg: NatsMessage) -> None:
        delivered = msg.raw_message.metadata.num_delivered or 1
        retry_in = await worker.handle(
            event, keepalive=msg.in_progress, last_delivery=delivered >= max_deliver
        )
        if retry_in is not None:
            await msg.nack(delay=retry_in)

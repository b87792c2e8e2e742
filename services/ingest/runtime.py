"""What the ingest process holds while it runs: routes, gateway, capture pipeline, object store."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from faststream.nats import NatsBroker
from sqlalchemy.engine import Engine

from services.ingest import handlers
from services.ingest.capture.call import spill_file
from services.ingest.capture.fidelity import FidelityFlusher
from services.ingest.capture.journal import Journal, journal_dir
from services.ingest.capture.pipeline import CapturePipeline
from services.ingest.capture.shipper_child import ShipperChild
from services.ingest.capture.spill_watch import SpillWatch
from services.ingest.config import IngestSettings
from services.ingest.gateway import forwarding
from services.ingest.gateway.calls import Gateway
from services.ingest.gateway.forwarding import service_urls
from services.ingest.gateway.routing import RoutingTable, load_upstreams
from services.ingest.gateway.wake import Waker
from services.ingest.models import UploadedFile
from services.ingest.otlp.traces import TraceReceiver
from services.ingest.otlp.workers import ExportMapper
from services.ingest.uploads import files as uploads
from shared import accel, bus
from shared.auth import CachedAuthenticator
from shared.events import Event, SampleCaptured
from shared.settings import Settings
from shared.storage import ObjectStore

log = logging.getLogger("tuneloop.ingest.state")


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
    engine: Engine
    spool_dir: Path
    # Where the gateway writes each call it answered; its shipper (a child process) makes the
    # samples (journal.py, shipper.py, shipper_child.py).
    journal: Journal
    shipper: ShipperChild
    # sample.captured -> the sample store, in batches (handlers.sample_persister); None when
    # separate persister processes do it (IngestSettings.persister).
    persister: bus.BatchConsumer[Any] | None
    # The fidelity report's counts -> the database, every few seconds (fidelity.py).
    fidelity: FidelityFlusher
    # OTLP exports -> samples, large ones in a pool of processes (otlp_workers.py).
    otlp: ExportMapper
    # POST /v1/traces, served ahead of FastAPI (traces.py, fastpath.py).
    traces: TraceReceiver
    # The spill file's backlog on /metrics, and capture.spilled once it is empty (spill_watch.py).
    spill_watch: SpillWatch
    _file_tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _upload_sweep: asyncio.Task[None] | None = None

    @classmethod
    def build(cls, *, settings: Settings, engine: Engine, broker: NatsBroker) -> Ingest:
        ingest_settings = IngestSettings()
        routes = RoutingTable(load_upstreams(ingest_settings.upstreams_file))
        store = ObjectStore.from_settings(settings.s3)

        async def publish(event: SampleCaptured) -> None:
            await bus.publish(broker, event)

        async def publish_event(event: Event) -> None:
            await bus.publish(broker, event)

        def can_publish() -> bool:
            return broker.connection is not None and broker.connection.is_connected

        async def publish_many(events: list[bus.EncodedEvent]) -> list[BaseException | None]:
            return await bus.publish_many(broker, events)

        # Uploads and OTLP exports are captured here, where they arrive; proxied calls by the
        # shipper, from the journal.
        pipeline = CapturePipeline(
            publish=publish,
            publish_many=publish_many,
            store=store,
            spill=spill_file(settings, ingest_settings),
            can_publish=can_publish,
        )
        journal = Journal(journal_dir(settings))
        gateway = Gateway(
            settings=ingest_settings,
            routes=routes,
            authenticator=CachedAuthenticator(engine, ttl_s=ingest_settings.auth_cache_ttl_s),
            capture=journal.append,
            report=publish_event,
            waker=Waker(
                client=httpx.AsyncClient(timeout=httpx.Timeout(60.0, connect=5.0)),
                hoster_url=ingest_settings.service_url("hoster", settings),
                service_token=settings.auth.service_token.get_secret_value(),
                timeout_s=ingest_settings.wake_timeout_s,
            ),
        )
        control_client = forwarding.control_client()
        mapper = ExportMapper(
            ingest_settings.otlp_processes,
            min_bytes=ingest_settings.otlp_process_min_bytes,
            cpu_class=ingest_settings.otlp_cpu,
        )
        spool_dir = settings.app.data_dir.resolve() / "ingest" / "uploads"
        return cls(
            ingest_settings,
            routes,
            store,
            pipeline,
            gateway,
            service_urls(settings, ingest_settings),
            control_client,
            engine,
            spool_dir,
            journal,
            ShipperChild(),
            handlers.sample_persister(
                broker=broker,
                engine=engine,
                store=store,
                fidelity=pipeline.fidelity,
                max_retry_delay_s=settings.nats.max_retry_delay_s,
            )
            if ingest_settings.persister == "inline"
            else None,
            FidelityFlusher(pipeline.fidelity, engine),
            mapper,
            TraceReceiver(gateway, pipeline, mapper),
            SpillWatch(pipeline.spill, publish=publish_event, can_publish=can_publish),
        )

    def process_in_background(self, row: UploadedFile, leased_to: str | None = None) -> None:
        """Claim the file (several processes sweep; the claim decides) and work it if won; a
        new upload's row written already leased to `leased_to` is worked without a claim."""
        task = asyncio.create_task(
            uploads.claim_and_process(
                engine=self.engine,
                store=self.store,
                pipeline=self.pipeline,
                row=row,
                spool_dir=self.spool_dir,
                lease_s=self.settings.upload_lease_s,
                max_attempts=self.settings.upload_max_attempts,
                leased_to=leased_to,
            ),
            name=f"upload-{row.id}",
        )
        self._file_tasks.add(task)
        task.add_done_callback(self._file_tasks.discard)

    async def start(self) -> None:
        log.info("%s", accel.status().describe())  # OTLP mapping's speed depends on it
        await asyncio.to_thread(self.store.wait_until_ready)
        await asyncio.to_thread(self.store.ensure_bucket)
        await self.pipeline.start()
        if self.persister is not None:
            await self.persister.start()
        await self.fidelity.start()
        await self.spill_watch.start()
        await self.shipper.start()
        if cleared := await asyncio.to_thread(uploads.clear_dead_spool, self.spool_dir):
            log.info("removed %d spool files of processes that were killed", cleared)
        self._upload_sweep = asyncio.create_task(
            uploads.sweep(
                self.engine,
                every_s=self.settings.upload_lease_s / 2,
                start=self.process_in_background,
            ),
            name="upload-sweep",
        )

    async def stop(self) -> None:
        # Unfinished files are handed back; a live process's sweep takes them.
        if self._upload_sweep is not None:
            self._upload_sweep.cancel()
        for task in list(self._file_tasks):
            task.cancel()
        await asyncio.gather(*self._file_tasks, return_exceptions=True)
        await self.pipeline.stop()
        self.journal.close()
        await self.shipper.stop()  # after the journal's last line: it ships what is left
        await self.fidelity.stop()  # after the pipeline: its last samples are counted
        await self.spill_watch.stop()
        # Last: the pipeline still publishes while it drains; what is not stored stays queued
        # in the stream for the next start.
        if self.persister is not None:
            await self.persister.stop()
        self.otlp.close()
        await self.gateway.aclose()
        await self.control_client.aclose()

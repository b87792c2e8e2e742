"""The ingest process's running parts, each with a start and a stop, and `Ingest`: what its
routes read. app.py builds them and starts them in order; they stop in reverse."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from faststream.nats import NatsBroker
from sqlalchemy.engine import Engine

from services.ingest import accel
from services.ingest.capture.fidelity import FidelityFlusher
from services.ingest.capture.pipeline import CapturePipeline
from services.ingest.config import IngestSettings
from services.ingest.gateway.calls import Gateway
from services.ingest.models import UploadedFile
from services.ingest.uploads import files as uploads
from shared import bus
from shared.events import Event
from shared.storage import ObjectStore

log = logging.getLogger("tuneloop.ingest.runtime")


async def _nothing() -> None:
    return None


@dataclass(frozen=True)
class Part:
    """A start and a stop, for app.py's list; either may be nothing."""

    start: Callable[[], Awaitable[None]] = _nothing
    stop: Callable[[], Awaitable[None]] = _nothing


@dataclass(frozen=True)
class Publisher:
    """The bus as capture's parts take it: one event, a batch of encoded ones, and whether it is
    up (capture spills instead of waiting while it is not)."""

    broker: NatsBroker

    async def event(self, event: Event) -> None:
        await bus.publish(self.broker, event)

    async def many(self, events: list[bus.EncodedEvent]) -> list[BaseException | None]:
        return await bus.publish_many(self.broker, events)

    def connected(self) -> bool:
        return self.broker.connection is not None and self.broker.connection.is_connected


def storage(store: ObjectStore) -> Part:
    """The object store, waited for and its bucket made before anything writes to it."""

    async def start() -> None:
        log.info("%s", accel.status().describe())  # OTLP mapping's speed depends on it
        await asyncio.to_thread(store.wait_until_ready)
        await asyncio.to_thread(store.ensure_bucket)

    return Part(start=start)


def closing(*closers: Callable[[], Awaitable[None] | None]) -> Part:
    """Clients and pools held open while the process runs, closed in order at its stop."""

    async def stop() -> None:
        for close in closers:
            result = close()
            if result is not None:
                await result

    return Part(stop=stop)


@dataclass
class Uploads:
    """Uploaded files worked into samples in the background: each claimed by one process (a
    lease), a killed process's files taken over by the sweep of a live one (uploads/files.py)."""

    engine: Engine
    store: ObjectStore
    pipeline: CapturePipeline
    spool_dir: Path
    settings: IngestSettings
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _sweep: asyncio.Task[None] | None = None

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
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def start(self) -> None:
        if cleared := await asyncio.to_thread(uploads.clear_dead_spool, self.spool_dir):
            log.info("removed %d spool files of processes that were killed", cleared)
        self._sweep = asyncio.create_task(
            uploads.sweep(
                self.engine,
                every_s=self.settings.upload_lease_s / 2,
                start=self.process_in_background,
            ),
            name="upload-sweep",
        )

    async def stop(self) -> None:
        # Unfinished files are handed back; a live process's sweep takes them.
        if self._sweep is not None:
            self._sweep.cancel()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


@dataclass
class Ingest:
    """What the routes read (`request.app.state.ingest`); its parts start and stop in app.py."""

    settings: IngestSettings
    engine: Engine
    store: ObjectStore
    pipeline: CapturePipeline
    gateway: Gateway
    uploads: Uploads
    # The fidelity report's counts -> the database, every few seconds (capture/fidelity.py).
    fidelity: FidelityFlusher
    # Control-plane calls relayed to the services that own them (gateway/forwarding.py).
    services: dict[str, str]
    control_client: httpx.AsyncClient

    @property
    def spool_dir(self) -> Path:
        return self.uploads.spool_dir

    def process_in_background(self, row: UploadedFile, leased_to: str | None = None) -> None:
        self.uploads.process_in_background(row, leased_to)

"""`python -m services.ingest.capture.persister`: the sample persister as a process of its own.

By default each ingest process also persists samples (`TUNELOOP_INGEST_PERSISTER=inline`). With
`process`, the gateway processes leave that work to one or more copies of this one, so the
gateway's event loop carries only calls and capture (the batch decode and the SQLite/PostgreSQL
writes no longer interleave with requests). Copies share the same durable JetStream consumer, so
running more of them splits the work; every insert is idempotent.
"""

from __future__ import annotations

import asyncio
import logging
import signal

import uvloop

from services.ingest import handlers
from services.ingest.capture.fidelity import Fidelity, FidelityFlusher
from services.ingest.config import IngestSettings
from shared import bus, db
from shared.processes import lower_cpu_priority, settle_heap
from shared.service import prepare_process
from shared.settings import Settings, get_settings
from shared.storage import ObjectStore

NAME = "ingest-persister"
log = logging.getLogger("tuneloop.ingest.persister")


async def serve(settings: Settings, stop: asyncio.Event) -> None:
    """Persist samples until `stop` is set; the batch in hand is stored before returning."""
    engine = db.make_engine(settings.database_url)
    broker = bus.make_broker(settings.nats, service=NAME)
    await asyncio.to_thread(db.wait_until_ready, engine, timeout_s=settings.nats.connect_timeout_s)
    await bus.connect(broker, settings.nats)
    assert broker.connection is not None
    await bus.declare_streams(broker.connection, settings.nats)
    # What it dead-letters is counted in the fidelity report, as the gateway counts its drops.
    fidelity = FidelityFlusher(Fidelity(), engine)
    persister = handlers.sample_persister(
        broker=broker,
        engine=engine,
        store=ObjectStore.from_settings(settings.s3),
        fidelity=fidelity.fidelity,
        max_retry_delay_s=settings.nats.max_retry_delay_s,
    )
    await persister.start()
    await fidelity.start()
    settle_heap(batch=True)  # start-up is done: its objects leave the collector's scans
    log.info("persisting samples (NATS %s)", settings.nats.url)
    try:
        await stop.wait()
    finally:
        await persister.stop()
        await fidelity.stop()
        await broker.stop()
        engine.dispose()


async def _main() -> None:
    settings = get_settings()
    prepare_process(NAME, settings)
    lower_cpu_priority(IngestSettings().background_cpu)  # calls come first
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await serve(settings, stop)


if __name__ == "__main__":
    uvloop.run(_main())

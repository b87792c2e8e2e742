"""OTLP exports decoded and mapped to samples in worker processes.

Decoding an export and assembling its traces is CPU-bound Python (60-100 us a span). On the
service's event loop, or in a thread under its GIL, a large export holds up every proxied call
the process serves, and uses one core however many the machine has. An `ExportMapper` sends
exports of `min_bytes` or more to a pool of processes (spawned: none inherits the event loop or
its connections), which decode, map, scrub and encode each sample as its `sample.captured`
event and hand back bytes (`PreparedSample`); the service process only publishes them. A sample
with inline media comes back as a sample: moving media to object storage is the capture
pipeline's work (it holds the store and its cache of keys stored already).

Smaller exports are mapped in the service process: the round trip to the pool costs more than
they do. A pool process that dies (killed, out of memory) fails the exports it held: the pool is
replaced and those requests get `MapperUnavailable` (503, which OTLP exporters retry).
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

from services.ingest.capture.pipeline import PreparedSample, has_inline_media
from services.ingest.capture.scrub import scrub_secrets
from services.ingest.normalize import Dropped
from services.ingest.otlp.export import decode_export
from services.ingest.otlp.genai_assembly import RejectedSpan
from services.ingest.otlp.genai_spans import spans_to_samples
from shared.chat import Sample
from shared.processes import CpuClass, lower_cpu_priority, settle_heap
from shared.service import prepare_worker

WORKER_NAME = "ingest-otlp"
# Above this size an export goes to the pool; below it, decoding is cheaper than the trip.
DEFAULT_MIN_BYTES = 64 * 1024
# What a compressed body is taken to grow by (OTLP spans gzip 5-10x): the work is the decoded
# size's, and a 60 KiB gzip body can hold half a megabyte of spans.
_COMPRESSION_RATIO = 8
log = logging.getLogger("tuneloop.ingest.otlp")


def _decoded_size(body: bytes, content_encoding: str | None) -> int:
    """The body's size once decompressed, estimated without decompressing it."""
    compressed = content_encoding is not None and content_encoding.strip().lower() != "identity"
    return len(body) * _COMPRESSION_RATIO if compressed else len(body)


class MapperUnavailable(RuntimeError):
    """The process mapping the export died before answering; the export may be sent again."""


@dataclass(slots=True)
class MappedExport:
    """What one export became: samples ready to publish, samples whose media must be moved
    first, and the spans and parts that were rejected or dropped (for partial success and the
    fidelity report)."""

    prepared: list[PreparedSample]
    with_media: list[Sample]
    rejected: list[RejectedSpan]
    dropped: list[Dropped]

    @property
    def samples(self) -> int:
        return len(self.prepared) + len(self.with_media)


def map_export(
    body: bytes, content_type: str, content_encoding: str | None, tenant: str
) -> MappedExport:
    """Decode an export and map its traces to samples. Raises OtlpDecodeError (and subclasses)
    for a body that is not a valid export. Runs in a pool process or in the service's."""
    result = spans_to_samples(decode_export(body, content_type, content_encoding), tenant=tenant)
    prepared: list[PreparedSample] = []
    with_media: list[Sample] = []
    for sample in result.samples:
        if has_inline_media(sample):
            with_media.append(sample)  # the pipeline scrubs it when it moves the media
        else:
            prepared.append(PreparedSample.of(scrub_secrets(sample)))
    return MappedExport(prepared, with_media, result.rejected, result.dropped)


def _start_worker(cpu_class: CpuClass) -> None:
    lower_cpu_priority(cpu_class)
    # Logging, the registered secrets scrubbing relies on, and death with the service.
    prepare_worker(WORKER_NAME)
    # Mapping allocates hundreds of thousands of short-lived objects an export: with the
    # collector's defaults, full collections of the start-up heap took up to 40% of the time.
    settle_heap(batch=True)


class ExportMapper:
    """Maps exports to samples, large ones in a pool of `processes`. The pool starts with the first large export; its processes run in
    `cpu_class` (shared.processes; "normal" leaves them as the service is)."""

    def __init__(
        self,
        processes: int,
        *,
        min_bytes: int = DEFAULT_MIN_BYTES,
        cpu_class: CpuClass = "normal",
    ) -> None:
        if processes < 1:
            raise ValueError(f"processes: {processes} (an export mapper needs at least one)")
        self.processes = processes
        self.min_bytes = min_bytes
        self.cpu_class = cpu_class
        self._pool: ProcessPoolExecutor | None = None

    async def map(
        self, body: bytes, content_type: str, content_encoding: str | None, tenant: str
    ) -> MappedExport:
        size = _decoded_size(body, content_encoding)
        if size >= self.min_bytes:
            return await self._in_pool(body, content_type, content_encoding, tenant)
        return map_export(body, content_type, content_encoding, tenant)

    async def _in_pool(
        self, body: bytes, content_type: str, content_encoding: str | None, tenant: str
    ) -> MappedExport:
        pool = self._pool or self._start()
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(
                pool, map_export, body, content_type, content_encoding, tenant
            )
        except BrokenProcessPool:
            if self._pool is pool:  # the first export to see it replaces the pool
                log.error("an OTLP mapping process died; starting a new pool")
                pool.shutdown(wait=False, cancel_futures=True)
                self._pool = None
            raise MapperUnavailable(
                "the process mapping this export stopped; send it again"
            ) from None

    def _start(self) -> ProcessPoolExecutor:
        self._pool = ProcessPoolExecutor(
            self.processes,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_start_worker,
            initargs=(self.cpu_class,),
        )
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

"""Captured calls journaled by the gateway -> samples, in a process of its own.

With `TUNELOOP_INGEST_CAPTURE=process` a gateway process does one thing with an answered call:
it appends it to its journal (one buffered write). Normalising, moving media, scrubbing and
publishing happen here instead, so none of it shares the event loop that serves calls (on a
2-core machine that work, interleaved with requests, doubled the gateway's added p50 at 1,000
req/s and tripled its p99). `python -m services.ingest.shipper` tails the journal directory:

- it reads each segment from where it stopped, whole lines only (a line without its newline is
  still being written, or was torn by a kill), and hands the calls to a `CapturePipeline`, which
  publishes `sample.captured` or, when NATS or S3 are away, keeps the sample in the spill file;
- it records how far it got in `<segment>.shipped` after each batch, so a restarted shipper goes
  on from there (what it shipped again after a kill is dropped by the stream's duplicate window
  and the idempotent store: event ids are deterministic);
- a segment whose writer has moved on to a newer one, or has died, is deleted once it is shipped.

One shipper works a directory at a time (an exclusive lock on `.shipper.lock`); a second copy
waits as a standby. It must run on the gateway's machine, since the journal is a local directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import signal
from dataclasses import dataclass
from pathlib import Path

import orjson
import uvloop

from services.ingest.capture import CapturedCall, SpillFile
from services.ingest.config import IngestSettings
from services.ingest.fidelity import FidelityFlusher
from services.ingest.journal import journal_dir, segment_id
from services.ingest.pipeline import CapturePipeline
from services.ingest.shipper_child import PARENT_ENV
from shared import bus, db
from shared.events import SampleCaptured
from shared.processes import die_with_parent, lower_cpu_priority, pid_alive, settle_heap
from shared.service import prepare_process
from shared.settings import Settings, get_settings
from shared.storage import ObjectStore

NAME = "ingest-shipper"
OFFSET_SUFFIX = ".shipped"
LOCK_NAME = ".shipper.lock"
log = logging.getLogger("tuneloop.ingest.shipper")


@dataclass(frozen=True)
class Segment:
    path: Path
    pid: int
    number: int

    @property
    def offset_path(self) -> Path:
        return self.path.with_name(self.path.name + OFFSET_SUFFIX)


@dataclass
class Batch:
    calls: list[CapturedCall]
    end: int  # the offset just past the last whole line read
    unreadable: int


def read_batch(path: Path, offset: int, limit: int) -> Batch:
    """Up to `limit` whole lines of a segment from `offset`."""
    calls: list[CapturedCall] = []
    unreadable = 0
    with path.open("rb") as handle:
        handle.seek(offset)
        for line in handle:
            if not line.endswith(b"\n"):
                break  # still being written, or torn by a kill: not a call yet
            offset += len(line)
            try:
                calls.append(CapturedCall.from_record(orjson.loads(line)))
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                # Lines are written whole by our own code; one that does not parse is damage
                # (a disk error) and holding the segment back for it would stop capture.
                log.error("unreadable journal line at %s:%d skipped: %s", path.name, offset, exc)
                unreadable += 1
            if len(calls) + unreadable >= limit:
                break
    return Batch(calls, offset, unreadable)


def _saved_offset(segment: Segment) -> int:
    try:
        return int(segment.offset_path.read_text())
    except (FileNotFoundError, ValueError):
        # No record, or one torn by a kill: start over; shipping a call twice stores it once.
        return 0


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return None


class JournalShipper:
    def __init__(
        self,
        directory: Path,
        pipeline: CapturePipeline,
        *,
        batch: int = 64,
        poll_s: float = 0.05,
    ) -> None:
        self.directory = directory
        self.pipeline = pipeline
        self._batch = batch
        self._poll_s = poll_s
        self._offsets: dict[Path, int] = {}
        self._lock: int | None = None

    def segments(self) -> list[Segment]:
        found = []
        for path in self.directory.glob("*.jsonl"):
            ids = segment_id(path)
            if ids is not None:
                found.append(Segment(path, *ids))
        return sorted(found, key=lambda s: (s.pid, s.number))

    async def ship_once(self) -> int:
        """One pass over every segment; returns how many calls were shipped."""
        segments = self.segments()
        newest: dict[int, int] = {}
        for segment in segments:
            newest[segment.pid] = max(newest.get(segment.pid, -1), segment.number)
        alive = {pid: pid_alive(pid) for pid in newest}
        shipped = 0
        for segment in segments:
            # Written to no more: its writer has opened a newer segment, or is gone.
            closed = segment.number < newest[segment.pid] or not alive[segment.pid]
            shipped += await self._ship(segment, closed=closed)
        return shipped

    async def _ship(self, segment: Segment, *, closed: bool) -> int:
        offset = self._offsets.get(segment.path)
        if offset is None:
            offset = _saved_offset(segment)
        if not closed and _size(segment.path) == offset:
            return 0  # nothing new: no read (a thread hop) every poll of an idle gateway's segment
        shipped = 0
        while True:
            try:
                batch = await asyncio.to_thread(read_batch, segment.path, offset, self._batch)
            except FileNotFoundError:
                self._offsets.pop(segment.path, None)
                return shipped
            if batch.end == offset:
                break
            await self.pipeline.process_many(batch.calls)
            offset = batch.end
            self._offsets[segment.path] = offset
            segment.offset_path.write_text(str(offset))
            shipped += len(batch.calls)
        if closed:
            self._finish(segment, offset)
        return shipped

    def _finish(self, segment: Segment, offset: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            left = segment.path.stat().st_size - offset
            if left:
                log.warning("%s ends in %d bytes of a torn line (its writer was killed)",
                            segment.path.name, left)  # fmt: skip
        segment.path.unlink(missing_ok=True)
        segment.offset_path.unlink(missing_ok=True)
        self._offsets.pop(segment.path, None)

    async def acquire(self, stop: asyncio.Event, *, retry_s: float = 1.0) -> bool:
        """Take the directory's shipper lock, waiting while another shipper holds it; False if
        `stop` came first."""
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.directory / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        while not stop.is_set():
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), retry_s)
                continue
            self._lock = fd
            return True
        os.close(fd)
        return False

    def release(self) -> None:
        if self._lock is not None:
            os.close(self._lock)  # closing the descriptor drops the flock
            self._lock = None

    async def run(self, stop: asyncio.Event) -> None:
        """Ship until `stop` is set; the batch in hand is finished first."""
        if not await self.acquire(stop):
            return
        log.info("shipping captured calls from %s", self.directory)
        try:
            while not stop.is_set():
                if not await self.ship_once():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), self._poll_s)
        finally:
            self.release()


async def serve(settings: Settings, stop: asyncio.Event) -> None:
    engine = db.make_engine(settings.database_url)
    broker = bus.make_broker(settings.nats, service=NAME)
    store = ObjectStore.from_settings(settings.s3)
    await asyncio.to_thread(db.wait_until_ready, engine, timeout_s=settings.nats.connect_timeout_s)
    await asyncio.to_thread(store.wait_until_ready)
    await bus.connect(broker, settings.nats)
    assert broker.connection is not None
    await bus.declare_streams(broker.connection, settings.nats)

    async def publish(event: SampleCaptured) -> None:
        await bus.publish(broker, event)

    def can_publish() -> bool:
        return broker.connection is not None and broker.connection.is_connected

    async def publish_many(events: list[bus.EncodedEvent]) -> list[BaseException | None]:
        return await bus.publish_many(broker, events)

    pipeline = CapturePipeline(
        publish=publish,
        publish_many=publish_many,
        store=store,
        spill=SpillFile(settings.app.data_dir.resolve() / "ingest" / "capture-spill.jsonl"),
        queue_size=IngestSettings().capture_queue_size,
        can_publish=can_publish,
        workers=0,  # nothing is submitted here: the shipper hands calls over itself
    )
    fidelity = FidelityFlusher(pipeline.fidelity, engine)
    await pipeline.start()
    await fidelity.start()
    settle_heap(batch=True)  # start-up is done: its objects leave the collector's scans
    try:
        await JournalShipper(journal_dir(settings), pipeline).run(stop)
    finally:
        await pipeline.stop()
        await fidelity.stop()
        await broker.stop()
        engine.dispose()


async def _main() -> None:
    settings = get_settings()
    prepare_process(NAME, settings)
    if parent := os.environ.get(PARENT_ENV):  # started by the ingest service (shipper_child)
        die_with_parent(int(parent))
    lower_cpu_priority(IngestSettings().background_cpu)  # calls come first
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await serve(settings, stop)


if __name__ == "__main__":
    uvloop.run(_main())

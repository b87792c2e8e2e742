"""Captured calls journaled by the gateway -> samples, in a process of its own.

A gateway process does one thing with an answered call: it appends it to its journal (one
buffered write, journal.py). Normalising, moving media, scrubbing and
publishing happen here instead, so none of it shares the event loop that serves calls (on a
2-core machine that work, interleaved with requests, doubled the gateway's added p50 at 1,000
req/s and tripled its p99). `python -m services.ingest.capture.shipper` tails the journal directory:

- it reads each segment from where it stopped, whole lines only (a line without its newline is
  still being written, or was torn by a kill), and hands the calls to a `CapturePipeline`, which
  publishes `sample.captured` or, when NATS or S3 are away, keeps the sample in the spill file;
- it records how far it got in `<segment>.shipped` after each batch, so a restarted shipper goes
  on from there (what it shipped again after a kill is dropped by the stream's duplicate window
  and the idempotent store: event ids are deterministic);
- a segment whose writer has moved on to a newer one, or is gone, is deleted once it is shipped;
  a writer is an incarnation (pid and start time), so a gateway restarted under its old pid is
  a new writer, and the old one's segments are shipped whole and deleted while the new one's
  are tailed;
- told to stop, it ships every whole line there is before exiting, waiting up to 5 s for its
  service to close the journal (`<writer>.closed`), so a cleanly stopped service leaves no
  segment behind.

The ingest service runs it as its child (shipper_child.py). One shipper works a directory at a
time (an exclusive lock on `.shipper.lock`); a second copy waits as a standby.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import orjson
import uvloop
from faststream.nats import NatsBroker

from services.ingest.capture.call import CapturedCall
from services.ingest.capture.fidelity import FidelityFlusher
from services.ingest.capture.journal import CLOSED_SUFFIX, SegmentName, journal_dir
from services.ingest.capture.pipeline import CapturePipeline
from services.ingest.capture.private_files import FILE_MODE, write_private
from services.ingest.capture.shipper_child import PARENT_ENV
from services.ingest.capture.spill import spill_file
from services.ingest.config import IngestSettings
from shared import bus, db
from shared.events import SampleCaptured
from shared.processes import Incarnation, die_with_parent, lower_cpu_priority, settle_heap
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
    name: SegmentName

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
        alive: Callable[[Incarnation], bool] = Incarnation.alive,
        linger_s: float = 5.0,
    ) -> None:
        self.directory = directory
        self.pipeline = pipeline
        self._batch = batch
        self._poll_s = poll_s
        self._alive = alive  # whether a writer still runs (a fake in tests)
        self._linger_s = linger_s
        self._offsets: dict[Path, int] = {}
        self._lock: int | None = None

    def segments(self) -> list[Segment]:
        found = []
        for path in self.directory.glob("*.jsonl"):
            name = SegmentName.parse(path)
            if name is not None:
                found.append(Segment(path, name))
        return sorted(found, key=lambda s: (s.path.name.rpartition("-")[0], s.name.number))

    async def ship_once(self) -> int:
        """One pass over every segment; returns how many calls were shipped."""
        segments = self.segments()
        newest: dict[Incarnation, int] = {}
        for segment in segments:
            if (writer := segment.name.writer) is not None:
                newest[writer] = max(newest.get(writer, -1), segment.name.number)
        closed_writers = self._closed_writers()
        alive = {w: w not in closed_writers and self._alive(w) for w in newest}
        shipped = 0
        for segment in segments:
            # Written to no more: an earlier version's, or its writer has opened a newer
            # segment, or is gone.
            writer = segment.name.writer
            closed = writer is None or segment.name.number < newest[writer] or not alive[writer]
            shipped += await self._ship(segment, closed=closed)
        if closed_writers:  # a writer whose last segment is gone goes too
            left = {segment.name.writer for segment in self.segments()}
            for writer in closed_writers - left:
                (self.directory / f"{writer.name}{CLOSED_SUFFIX}").unlink(missing_ok=True)
        return shipped

    def _closed_writers(self) -> set[Incarnation]:
        found = set()
        for path in self.directory.glob("*" + CLOSED_SUFFIX):
            writer = Incarnation.parse(path.name.removesuffix(CLOSED_SUFFIX))
            if writer is not None:
                found.add(writer)
        return found

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
            await asyncio.to_thread(write_private, segment.offset_path, b"%d" % offset)
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
        fd = os.open(self.directory / LOCK_NAME, os.O_RDWR | os.O_CREAT, FILE_MODE)
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
        """Ship until `stop` is set, then once more: every whole line written by then."""
        if not await self.acquire(stop):
            return
        log.info("shipping captured calls from %s", self.directory)
        try:
            while not stop.is_set():
                if not await self.ship_once():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), self._poll_s)
            await self._last_pass()
        finally:
            self.release()

    async def _last_pass(self) -> None:
        """Ship what is left, waiting (a while) for writers still running to finish: stopped
        with its service's process group, the shipper hears SIGTERM while the service still
        answers its last calls and has yet to close its journal."""
        deadline = time.monotonic() + self._linger_s
        while True:
            await self.ship_once()
            if not self.segments() or time.monotonic() >= deadline:
                return
            await asyncio.sleep(self._poll_s)


async def serve(settings: Settings, stop: asyncio.Event) -> None:
    engine = db.make_engine(settings.database_url)
    broker = bus.make_broker(settings.nats, service=NAME)
    store = ObjectStore.from_settings(settings.s3)
    await asyncio.to_thread(db.wait_until_ready, engine, timeout_s=settings.nats.connect_timeout_s)
    # Not waited for: a shipper started while NATS is away ships into the spill file meanwhile,
    # so the journal it reads stays small and the spill file's cap bounds what waits on disk.
    connecting = asyncio.create_task(_connect(broker, settings), name="shipper-connect")

    async def publish(event: SampleCaptured) -> None:
        await bus.publish(broker, event)

    def can_publish() -> bool:
        return connecting.done() and broker.connection.is_connected

    async def publish_many(events: list[bus.EncodedEvent]) -> list[BaseException | None]:
        return await bus.publish_many(broker, events)

    pipeline = CapturePipeline(
        publish=publish,
        publish_many=publish_many,
        store=store,
        spill=spill_file(settings, IngestSettings()),
        can_publish=can_publish,
    )
    fidelity = FidelityFlusher(pipeline.fidelity, engine)
    await pipeline.start()
    await fidelity.start()
    settle_heap(batch=True)  # start-up is done: its objects leave the collector's scans
    try:
        await JournalShipper(journal_dir(settings), pipeline).run(stop)
    finally:
        connecting.cancel()
        await pipeline.stop()
        await fidelity.stop()
        await broker.stop()
        engine.dispose()


async def _connect(broker: NatsBroker, settings: Settings) -> None:
    """Connect to NATS however long it takes (each try bounded, each failure logged)."""
    while True:
        try:
            await bus.connect(broker, settings.nats)
            break
        except bus.BusUnavailable as exc:
            log.warning("%s; samples go to the spill file until it is reachable", exc)
    await bus.declare_streams(broker.connection, settings.nats)


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

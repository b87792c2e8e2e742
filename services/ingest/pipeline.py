"""The capture pipeline: a bounded queue, a few workers, and replay of the spill file."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from services.ingest.capture import (
    CapturedCall,
    Fidelity,
    Publish,
    PublishMany,
    SpillFile,
    to_exchange,
)
from services.ingest.journal import Journal, Ticket
from services.ingest.media import offload_media
from services.ingest.normalize import NormalizeError, normalize
from services.ingest.scrub import scrub_secrets
from shared import bus
from shared.chat import MediaPart, Sample
from shared.events import SampleCaptured
from shared.storage import ObjectStore

log = logging.getLogger("tuneloop.ingest.capture")


def _event_id(sample: Sample) -> str:
    # Deterministic, so a replayed publish is dropped by the stream's duplicate window; the
    # length is part of it, so a conversation that grew (OTLP in several exports) still goes out.
    return f"{sample.id}-{len(sample.messages)}"


def _event(sample: Sample) -> SampleCaptured:
    return SampleCaptured(tenant=sample.tenant, event_id=_event_id(sample), sample=sample)


def has_inline_media(sample: Sample) -> bool:
    return any(
        isinstance(part, MediaPart) and part.data is not None
        for message in sample.messages
        for part in message.content
    )


@dataclass(frozen=True, slots=True)
class PreparedSample:
    """A sample ready to publish: secrets scrubbed, no inline media, encoded as its
    sample.captured event. Small and cheap to pickle, so an OTLP decoding process can hand it
    back (otlp_workers.py) and the service process only sends the bytes."""

    tenant: str
    source: str
    sample_id: str
    event: bus.EncodedEvent

    def __reduce__(self) -> tuple[type[PreparedSample], tuple[Any, ...]]:
        # As EncodedEvent's: the dataclass default pickles field by field in Python.
        return type(self), (self.tenant, self.source, self.sample_id, self.event)

    @classmethod
    def of(cls, sample: Sample) -> PreparedSample:
        """`sample` (scrubbed, its media moved out) encoded."""
        # Without None fields, as the store keeps samples (Sample.to_json_bytes): smaller on
        # the bus, and the persister has no nulls to strip (samples.row_from_event).
        event = bus.encode(_event(sample), exclude_none=True)
        return cls(sample.tenant, sample.source, sample.id, event)


class CapturePipeline:
    def __init__(
        self,
        *,
        publish: Publish,
        store: ObjectStore | None,
        publish_many: PublishMany | None = None,
        spill: SpillFile,
        queue_size: int,
        can_publish: Callable[[], bool],
        journal: Journal | None = None,
        workers: int = 4,
        replay_interval_s: float = 1.0,
    ) -> None:
        self._publish = publish
        # Several samples in flight at once, each outcome reported (shared.bus.publish_many);
        # given only `publish` (tests), events are decoded back and published one by one.
        self._publish_many = publish_many or self._publish_each
        self._store = store
        self.spill = spill
        self._queue: asyncio.Queue[tuple[CapturedCall, Ticket | None]] = asyncio.Queue(
            maxsize=queue_size
        )
        self._journal = journal
        self._can_publish = can_publish
        self._workers = workers
        self._replay_interval_s = replay_interval_s
        self._tasks: list[asyncio.Task[None]] = []
        self._known_media: set[str] = set()
        self.fidelity = Fidelity()

    def submit(self, call: CapturedCall) -> None:
        """Hand a finished call over; never blocks, never raises into the request."""
        ticket = self._journal.append(call) if self._journal is not None else None
        try:
            self._queue.put_nowait((call, ticket))
        except asyncio.QueueFull:
            self.spill.append("call", call.to_record())
            self._done(ticket)

    def _done(self, ticket: Ticket | None) -> None:
        if self._journal is not None and ticket is not None:
            self._journal.done(ticket)

    async def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._work(), name=f"capture-{i}") for i in range(self._workers)
        ]
        self._tasks.append(asyncio.create_task(self._replay_forever(), name="capture-replay"))
        self._tasks.append(asyncio.create_task(self._recover_journal(), name="capture-recover"))

    async def _recover_journal(self) -> None:
        """Calls a killed process had journaled but not finished are processed again."""
        if self._journal is None:
            return
        for orphan in self._journal.orphans():
            segment = self._journal.adopt(orphan)
            if segment is None:
                continue  # a sibling worker process is recovering it
            calls = self._journal.calls(segment)
            for call in calls:
                await self.process(call)
            segment.unlink(missing_ok=True)
            log.info("recovered %d captured calls from %s", len(calls), orphan.name)

    async def stop(self, timeout_s: float = 10.0) -> None:
        """Finish what is queued (bounded), spill the rest, stop the workers."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._queue.join(), timeout_s)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        while not self._queue.empty():
            call, ticket = self._queue.get_nowait()
            self.spill.append("call", call.to_record())
            self._done(ticket)
        if self._journal is not None:
            self._journal.close()

    async def _work(self) -> None:
        while True:
            call, ticket = await self._queue.get()
            try:
                await self.process(call)
                # Not in `finally`: a call cut off by shutdown stays in the journal and is
                # processed again at the next start-up.
                self._done(ticket)
            finally:
                self._queue.task_done()

    async def process(self, call: CapturedCall) -> None:
        for sample in self._samples(call):
            await self.deliver(sample)

    async def process_many(self, calls: list[CapturedCall]) -> None:
        """Calls in a batch (the shipper's), their samples published together."""
        await self.deliver_many([sample for call in calls for sample in self._samples(call)])

    def _samples(self, call: CapturedCall) -> list[Sample]:
        """The call's samples; none when it is rejected (counted) or kept in the spill file."""
        try:
            normalized = normalize(to_exchange(call))
        except NormalizeError as exc:
            self.fidelity.count_rejected(call.tenant, "gateway", f"{exc.path}: {exc.reason}")
            log.warning("call %s not captured: %s", call.request_id, exc)
            return []
        except Exception:
            # A bug of ours must not lose the call: keep it for a fixed version to replay.
            log.exception(
                "call %s could not be normalised; kept in the spill file", call.request_id
            )
            self.spill.append("call", call.to_record())
            return []
        for dropped in normalized.dropped:
            self.fidelity.count_dropped(call.tenant, "gateway", dropped.reason)
        return normalized.samples

    async def _prepare(self, sample: Sample) -> Sample:
        """Secrets scrubbed, inline media moved to object storage."""
        sample = scrub_secrets(sample)
        if has_inline_media(sample):
            if self._store is None:
                raise RuntimeError("no object store configured for media")
            sample = await asyncio.to_thread(offload_media, sample, self._store, self._known_media)
            if len(self._known_media) > 100_000:
                self._known_media.clear()  # only a cache of keys known to exist in S3
        return sample

    def _spill(self, sample: Sample, exc: BaseException) -> None:
        self._spill_record(sample.id, sample.model_dump(mode="json"), exc)

    def _spill_record(self, sample_id: str, payload: dict[str, Any], exc: BaseException) -> None:
        log.warning("sample %s spilled for replay: %s: %s", sample_id, type(exc).__name__, exc)
        self.spill.append("sample", payload)

    async def deliver(self, sample: Sample) -> None:
        """Offload media, publish; on any failure keep the sample in the spill file."""
        try:
            sample = await self._prepare(sample)
            await self._publish(_event(sample))
        except Exception as exc:
            self._spill(sample, exc)
            return
        self.fidelity.count_sample(sample.tenant, sample.source)

    async def deliver_many(self, samples: list[Sample], *, batch: int = 256) -> None:
        """Deliver many samples (an upload chunk, an OTLP request, a shipper batch): published
        together, each one that fails kept in the spill file."""
        ready: list[PreparedSample] = []
        for sample in samples:
            try:
                ready.append(PreparedSample.of(await self._prepare(sample)))
            except Exception as exc:
                self._spill(sample, exc)
        await self.deliver_prepared(ready, batch=batch)

    async def deliver_prepared(self, prepared: list[PreparedSample], *, batch: int = 256) -> None:
        """Publish samples prepared already (here, or in an OTLP decoding process) together;
        each one that fails is kept in the spill file."""
        for start in range(0, len(prepared), batch):
            chunk = prepared[start : start + batch]
            outcomes = await self._publish_many([item.event for item in chunk])
            for item, error in zip(chunk, outcomes, strict=True):
                if error is None:
                    self.fidelity.count_sample(item.tenant, item.source)
                else:
                    # The spill keeps samples, not events: the one inside the event's JSON.
                    sample = orjson.loads(item.event.payload)["sample"]
                    self._spill_record(item.sample_id, sample, error)

    async def _publish_each(self, events: list[bus.EncodedEvent]) -> list[BaseException | None]:
        async def one(encoded: bus.EncodedEvent) -> BaseException | None:
            try:
                await self._publish(SampleCaptured.model_validate_json(encoded.payload))
            except Exception as exc:
                return exc
            return None

        return list(await asyncio.gather(*(one(event) for event in events)))

    async def replay(self) -> int:
        """Process every spilled record once; what fails again is spilled anew. Returns the count."""
        count = 0
        for claimed in self.spill.claim():
            for record in self.spill.records(claimed):
                if record["kind"] == "call":
                    await self.process(CapturedCall.from_record(record["payload"]))
                else:
                    await self.deliver(Sample.model_validate(record["payload"]))
                count += 1
            claimed.unlink(missing_ok=True)  # a dead owner's claim may be replayed twice
        if count:
            log.info("replayed %d spilled capture records", count)
        return count

    async def _replay_forever(self) -> None:
        while True:
            await asyncio.sleep(self._replay_interval_s)
            if self.spill.pending() and self._can_publish():
                try:
                    await self.replay()
                except Exception:
                    log.exception("spill replay failed; will retry")

"""The capture pipeline: captured calls and samples -> `sample.captured`, or the spill file.

Every source ends here: the shipper hands over the calls the gateway journaled, uploads and
OTLP exports their samples. Each sample is scrubbed of secrets, its inline media moved to object
storage, and published; one whose event would be larger than `INLINE_SAMPLE_MAX_BYTES` is
written to object storage whole and published by reference (a call may bring 32 MiB, the
samples stream takes 8). What cannot be published now (NATS or S3 away) is kept in the spill
file and replayed, as a stream, once publishing works again; past the spill file's cap a sample
is refused, counted in the fidelity report and logged as an error, and the call it came from has
been answered all the same. A call our own code fails to read goes to a second file, held for
the next start (a fixed version) instead of failing again every second.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

import orjson

from services.ingest.capture.call import CapturedCall, Publish, PublishMany, to_exchange
from services.ingest.capture.fidelity import Fidelity
from services.ingest.capture.media import offload_media
from services.ingest.capture.scrub import scrub_secrets
from services.ingest.capture.spill import SpillFile
from services.ingest.normalize import NormalizeError, normalize
from shared import bus
from shared.chat import MediaPart, Sample
from shared.events import INLINE_SAMPLE_MAX_BYTES, SampleCaptured
from shared.storage import ObjectStore

log = logging.getLogger("tuneloop.ingest.capture")

SPILL_FULL = "capture spill full"  # the fidelity report's reason for a refused sample
_REPLAY_BATCH = 256
_LOUD_EVERY_S = 10.0


def _event_id(sample: Sample) -> str:
    # Deterministic, so a replayed publish is dropped by the stream's duplicate window; the
    # length is part of it, so a conversation that grew (OTLP in several exports) still goes out.
    return f"{sample.id}-{len(sample.messages)}"


def _event(sample: Sample) -> SampleCaptured:
    return SampleCaptured(tenant=sample.tenant, event_id=_event_id(sample), sample=sample)


def sample_key(tenant: str, event_id: str) -> str:
    """Where a sample published by reference is kept (under its tenant's prefix)."""
    return f"tenants/{tenant}/samples/{event_id}.json"


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
    back (otlp/workers.py) and the service process only sends the bytes."""

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

    def sample_json(self) -> dict[str, Any]:
        """The sample inside the event (what the spill file and a by-reference object keep)."""
        sample: dict[str, Any] = orjson.loads(self.event.payload)["sample"]
        return sample


class CapturePipeline:
    def __init__(
        self,
        *,
        publish: Publish,
        store: ObjectStore | None,
        publish_many: PublishMany | None = None,
        spill: SpillFile,
        held: SpillFile | None = None,
        can_publish: Callable[[], bool],
        replay_interval_s: float = 1.0,
        inline_max_bytes: int = INLINE_SAMPLE_MAX_BYTES,
    ) -> None:
        self._publish = publish
        # Several samples in flight at once, each outcome reported (shared.bus.publish_many);
        # given only `publish` (tests), events are decoded back and published one by one.
        self._publish_many = publish_many or self._publish_each
        self._store = store
        self.spill = spill
        self.held = held or SpillFile(
            spill.path.with_name(spill.path.stem + "-held.jsonl"), max_bytes=spill.max_bytes
        )
        self._can_publish = can_publish
        self._replay_interval_s = replay_interval_s
        self._inline_max_bytes = inline_max_bytes
        self._tasks: list[asyncio.Task[None]] = []
        self._known_media: set[str] = set()
        self.fidelity = Fidelity()
        self.refused = 0  # samples refused at the spill file's cap, since start
        self._refused_logged = (0, 0.0)  # (count, when) at the last error line

    async def start(self) -> None:
        self._tasks = [asyncio.create_task(self._replay_forever(), name="capture-replay")]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        self._flush_ledger()

    def _flush_ledger(self) -> None:
        """Whose samples were spilled, to the ledger the spill watcher reads (spill_contents.py)."""
        if self.spill.ledger is None:
            return
        try:
            self.spill.ledger.flush()
        except OSError:  # the disk: said, and the counts lost (the samples are in the spill)
            log.exception("could not write %s", self.spill.ledger.path)

    async def process(self, call: CapturedCall) -> None:
        await self.process_many([call])

    async def process_many(self, calls: Iterable[CapturedCall]) -> None:
        """Calls in a batch (the shipper's), their samples published together."""
        await self.deliver_many([sample for call in calls for sample in self._samples(call)])

    def _samples(self, call: CapturedCall) -> list[Sample]:
        """The call's samples; none when it is rejected (counted) or held for a fixed version."""
        try:
            normalized = normalize(to_exchange(call))
        except NormalizeError as exc:
            self.fidelity.count_rejected(call.tenant, "gateway", f"{exc.path}: {exc.reason}")
            log.warning("call %s not captured: %s", call.request_id, exc)
            return []
        except Exception:
            # A bug of ours must not lose the call: hold it for a fixed version to replay.
            log.exception("call %s could not be normalised; held for the next start",
                          call.request_id)  # fmt: skip
            self._keep(self.held, "call", call.to_record(), call.tenant, "gateway")
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

    async def deliver(self, sample: Sample) -> None:
        await self.deliver_many([sample])

    async def deliver_many(self, samples: list[Sample], *, batch: int = 256) -> None:
        """Deliver many samples (an upload chunk, an OTLP request, a shipper batch): published
        together, each one that fails kept in the spill file."""
        ready: list[PreparedSample] = []
        for sample in samples:
            try:
                ready.append(PreparedSample.of(await self._prepare(sample)))
            except Exception as exc:
                self._spill(sample.tenant, sample.source, sample.id,
                            sample.model_dump(mode="json"), exc)  # fmt: skip
        await self.deliver_prepared(ready, batch=batch)

    async def deliver_prepared(self, prepared: list[PreparedSample], *, batch: int = 256) -> None:
        """Publish samples prepared already (here, or in an OTLP decoding process) together;
        each one that fails is kept in the spill file."""
        for start in range(0, len(prepared), batch):
            chunk = []
            for item in prepared[start : start + batch]:
                if (sized := await self._sized(item)) is not None:
                    chunk.append(sized)
            outcomes = await self._publish_many([sent.event for _, sent in chunk])
            for (item, _), error in zip(chunk, outcomes, strict=True):
                if error is None:
                    self.fidelity.count_sample(item.tenant, item.source)
                else:
                    self._spill(item.tenant, item.source, item.sample_id, item.sample_json(), error)

    async def _sized(self, item: PreparedSample) -> tuple[PreparedSample, PreparedSample] | None:
        """(the item, what to publish for it): itself, or past the inline limit its sample
        written to object storage and an event naming it; None when that failed (spilled)."""
        if len(item.event.payload) <= self._inline_max_bytes:
            return item, item
        try:
            if self._store is None:
                raise RuntimeError("no object store configured for oversized samples")
            key = sample_key(item.tenant, item.event.event_id)
            body = orjson.dumps(item.sample_json())
            await asyncio.to_thread(
                self._store.put_bytes, key, body, content_type="application/json"
            )
        except Exception as exc:
            self._spill(item.tenant, item.source, item.sample_id, item.sample_json(), exc)
            return None
        event = SampleCaptured(
            tenant=item.tenant, event_id=item.event.event_id, sample_ref=self._store.uri(key)
        )
        log.info("sample %s (%d bytes) published by reference to %s",
                 item.sample_id, len(body), key)  # fmt: skip
        return item, replace(item, event=bus.encode(event, exclude_none=True))

    def _spill(
        self, tenant: str, source: str, sample_id: str, payload: dict[str, Any], exc: BaseException
    ) -> None:
        log.warning("sample %s spilled for replay: %s: %s", sample_id, type(exc).__name__, exc)
        self._keep(self.spill, "sample", payload, tenant, source)

    def _keep(
        self, spill: SpillFile, kind: str, payload: dict[str, Any], tenant: str, source: str
    ) -> None:
        if spill.append(kind, payload, tenant=tenant):
            return
        # Past the cap: the caller's call was answered; this sample is not kept. Counted per
        # tenant in the fidelity report, and an error line now and every few seconds after.
        self.fidelity.count_dropped(tenant, source, SPILL_FULL)
        self.refused += 1
        logged, when = self._refused_logged
        if logged == 0 or time.monotonic() - when >= _LOUD_EVERY_S:
            log.error(
                "capture refused %d sample(s) since start: %s holds %d bytes, its cap "
                "(TUNELOOP_INGEST_SPILL_MAX_BYTES) is %d; NATS or S3 has been away too long",
                self.refused, spill.path, spill.used(), spill.max_bytes,
            )  # fmt: skip
            self._refused_logged = (self.refused, time.monotonic())

    async def _publish_each(self, events: list[bus.EncodedEvent]) -> list[BaseException | None]:
        async def one(encoded: bus.EncodedEvent) -> BaseException | None:
            try:
                await self._publish(SampleCaptured.model_validate_json(encoded.payload))
            except Exception as exc:
                return exc
            return None

        return list(await asyncio.gather(*(one(event) for event in events)))

    async def replay(self, spill: SpillFile | None = None) -> int:
        """Process every record of the spill file (or `spill`) once, reading it as a stream;
        what fails again is written back. Returns the count."""
        spill = spill or self.spill
        count = 0
        with SpillFile.readmitting():
            for claimed in spill.claim():
                calls: list[CapturedCall] = []
                samples: list[Sample] = []
                for record in spill.records(claimed):
                    if record["kind"] == "call":
                        calls.append(CapturedCall.from_record(record["payload"]))
                    else:
                        samples.append(Sample.model_validate(record["payload"]))
                    count += 1
                    if len(calls) + len(samples) >= _REPLAY_BATCH:
                        await self._replay_batch(calls, samples)
                        calls, samples = [], []
                await self._replay_batch(calls, samples)
                claimed.unlink(missing_ok=True)  # a dead owner's claim may be replayed twice
        if count:
            log.info("replayed %d records of %s", count, spill.path.name)
        return count

    async def _replay_batch(self, calls: list[CapturedCall], samples: list[Sample]) -> None:
        await self.process_many(calls)
        await self.deliver_many(samples)

    async def _replay_forever(self) -> None:
        held_replayed = False
        while True:
            await asyncio.sleep(self._replay_interval_s)
            self._flush_ledger()
            if not self._can_publish():
                continue
            try:
                if not held_replayed:  # once per start: what a fixed version may now read
                    await self.replay(self.held)
                    held_replayed = True
                if self.spill.pending():
                    await self.replay()
            except Exception:
                log.exception("spill replay failed; will retry")

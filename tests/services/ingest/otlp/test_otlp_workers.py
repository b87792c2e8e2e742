"""OTLP exports mapped in pool processes (otlp/workers.py): the same samples as mapped in this
process, errors that keep their type and path on the way back, a dead pool process answered as
retryable and replaced, and prepared samples that fail to publish kept whole in the spill file."""

from __future__ import annotations

import asyncio
import base64
import gzip
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from google.rpc.status_pb2 import Status

from services.ingest.capture.pipeline import CapturePipeline
from services.ingest.capture.spill import SpillFile
from services.ingest.otlp.export import OtlpDecodeError, OtlpTooLargeError
from services.ingest.otlp.traces import export_failure
from services.ingest.otlp.workers import ExportMapper, MappedExport, MapperUnavailable, map_export
from shared import bus
from shared.bus import EncodedEvent
from shared.events import SampleCaptured
from shared.settings import NatsSettings
from tests.benchmarks.otlp_traces import SpanData, TraceFactory, to_json, to_protobuf

PROTOBUF, JSON = "application/x-protobuf", "application/json"
SECRET = "sk-proj-" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6"
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(range(64))).decode()


def _export(traces: int, *, image: bool = False, encoding: str = "protobuf") -> bytes:
    """`traces` agent traces (one sample each); the first trace's question carries a pasted
    key and, with `image`, the second's a PNG."""
    factory = TraceFactory(seed=11)
    per_trace = [factory.trace() for _ in range(traces)]
    _add_to_question(per_trace[0], {"type": "text", "content": f"my key is {SECRET}"})
    if image:
        blob = {"type": "blob", "modality": "image", "mime_type": "image/png", "content": PNG}
        _add_to_question(per_trace[1], blob)
    spans = [span for trace in per_trace for span in trace]
    return to_protobuf(spans) if encoding == "protobuf" else to_json(spans)


def _add_to_question(trace: list[SpanData], part: dict[str, str]) -> None:
    """`part` added to the user's question in every chat span's history, as an agent sends it."""
    for span in trace:
        if span.attributes.get("gen_ai.operation.name") == "chat":
            history = orjson.loads(span.attributes["gen_ai.input.messages"])
            history[0]["parts"].append(part)
            span.attributes["gen_ai.input.messages"] = orjson.dumps(history).decode()


@pytest.fixture
def mapper() -> Iterator[ExportMapper]:
    mapper = ExportMapper(1, min_bytes=0)
    yield mapper
    mapper.close()


def _map(mapper: ExportMapper, body: bytes, content_type: str = PROTOBUF) -> MappedExport:
    return asyncio.run(mapper.map(body, content_type, None, "acme"))


def _events(mapped: MappedExport) -> list[tuple[object, ...]]:
    """Each prepared sample as what identifies it, with its event's JSON less the time the
    event was made."""
    found = []
    for item in mapped.prepared:
        event = orjson.loads(item.event.payload)
        del event["occurred_at"]
        found.append((item.tenant, item.source, item.sample_id, item.event.subject,
                      item.event.stream, item.event.event_id, item.event.headers, event))  # fmt: skip
    return found


@pytest.mark.parametrize("encoding", ["protobuf", "json"])
def test_a_pool_process_maps_an_export_as_this_process_does(
    mapper: ExportMapper, encoding: str
) -> None:
    content_type = PROTOBUF if encoding == "protobuf" else JSON
    body = _export(4, image=True, encoding=encoding)
    here = map_export(body, content_type, None, "acme")
    there = _map(mapper, body, content_type)
    assert _events(there) == _events(here)  # the same events, ids and headers
    assert there.with_media == here.with_media
    assert (there.rejected, there.dropped) == (here.rejected, here.dropped)
    # The trace with an image comes back as a sample (its media is the pipeline's to move);
    # the others come back encoded, scrubbed, as sample.captured events.
    assert (len(there.with_media), len(there.prepared), there.samples) == (1, 3, 4)
    for item in there.prepared:
        event = SampleCaptured.model_validate_json(item.event.payload)
        assert (item.tenant, item.source, item.sample_id) == ("acme", "otlp", event.sample.id)
        assert item.event.subject == event.subject
        assert item.event.event_id == event.event_id
        assert SECRET not in item.event.payload.decode()
    assert b"[REDACTED]" in there.prepared[0].event.payload
    assert there.with_media[0].messages[1].content[-1].data == PNG


def test_errors_raised_in_a_pool_process_keep_their_type_and_path(mapper: ExportMapper) -> None:
    with pytest.raises(OtlpDecodeError) as here:
        map_export(b"\x0a\xff\xff", PROTOBUF, None, "acme")
    with pytest.raises(OtlpDecodeError) as there:
        _map(mapper, b"\x0a\xff\xff")
    assert (type(there.value), str(there.value)) == (type(here.value), str(here.value))

    value: dict[str, object] = {"stringValue": "deep"}
    for _ in range(20):
        value = {"arrayValue": {"values": [value]}}
    span = {"traceId": "ab" * 16, "spanId": "cd" * 8, "name": "s", "startTimeUnixNano": "1",
            "endTimeUnixNano": "2", "attributes": [{"key": "deep", "value": value}]}  # fmt: skip
    deep = orjson.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]})
    with pytest.raises(OtlpTooLargeError) as too_deep:
        _map(mapper, deep, JSON)
    assert too_deep.value.path.startswith("resourceSpans[0].scopeSpans[0].spans[0].attributes[0]")
    assert "nested deeper than" in too_deep.value.reason
    with pytest.raises(OtlpTooLargeError) as here:
        map_export(deep, JSON, None, "acme")
    assert (too_deep.value.path, too_deep.value.reason) == (here.value.path, here.value.reason)


def test_a_killed_pool_process_fails_as_retryable_and_a_new_pool_takes_the_next_export(
    mapper: ExportMapper,
) -> None:
    body = _export(2)
    assert _map(mapper, body).samples == 2
    pool = mapper._pool
    assert pool is not None
    for pid in list(pool._processes):  # type: ignore[attr-defined]  # the pool's own processes
        os.kill(pid, signal.SIGKILL)
    with pytest.raises(MapperUnavailable, match="send it again") as died:
        _map(mapper, body)
    # Answered 503 (which exporters retry) with a Retry-After and an UNAVAILABLE Status.
    answer = export_failure(died.value, PROTOBUF)
    assert (answer.status_code, answer.headers, answer.media_type) == (
        503,
        {"Retry-After": "1"},
        PROTOBUF,
    )
    assert Status.FromString(answer.body).code == 14
    assert _map(mapper, body).samples == 2
    assert mapper._pool is not pool


def test_pool_processes_run_in_the_cpu_class_asked_for() -> None:
    batch = ExportMapper(2, min_bytes=0, cpu_class="batch")
    try:
        mapped = asyncio.run(_map_many(batch, [_export(2), _export(2)]))
        assert [m.samples for m in mapped] == [2, 2]
        pool = batch._pool
        assert pool is not None
        pids = list(pool._processes)  # type: ignore[attr-defined]  # the pool's own processes
        assert len(pids) == 2
        # A worker started on demand sets its class in its initializer, which may still be
        # running when the other worker has mapped both exports (seen under load).
        deadline = time.monotonic() + 10
        while {os.sched_getscheduler(pid) for pid in pids} != {os.SCHED_BATCH}:
            assert time.monotonic() < deadline, [os.sched_getscheduler(pid) for pid in pids]
            time.sleep(0.05)
        assert os.sched_getscheduler(0) != os.SCHED_BATCH  # the service process keeps its class
    finally:
        batch.close()


async def _map_many(mapper: ExportMapper, bodies: list[bytes]) -> list[MappedExport]:
    return await asyncio.gather(*(mapper.map(body, PROTOBUF, None, "acme") for body in bodies))


def test_small_exports_stay_in_this_process() -> None:
    with pytest.raises(ValueError, match="processes: 0"):
        ExportMapper(0)
    mapper = ExportMapper(2, min_bytes=1 << 20)
    assert _map(mapper, _export(2)).samples == 2
    assert mapper._pool is None


def test_a_compressed_export_is_sized_by_what_it_decompresses_to() -> None:
    body = _export(8)
    packed = gzip.compress(body)
    # Below the threshold as sent, above it as the 8x a gzip body is taken to grow by.
    mapper = ExportMapper(1, min_bytes=len(packed) * 4)
    try:
        mapped = asyncio.run(mapper.map(packed, PROTOBUF, "gzip", "acme"))
        assert mapped.samples == 8
        assert mapper._pool is not None  # small on the wire, large to decode: the pool's
    finally:
        mapper.close()


def test_prepared_samples_that_fail_to_publish_are_spilled_whole_and_replayed(
    tmp_path: Path,
) -> None:
    published: list[SampleCaptured] = []

    async def publish(event: SampleCaptured) -> None:
        published.append(event)

    # The real publish_many on a broker that never connected: what NATS being away looks like.
    broker = bus.make_broker(NatsSettings(), service="test")

    away = True

    async def nats_away(events: list[EncodedEvent]) -> list[BaseException | None]:
        if not away:  # NATS is back
            for event in events:
                await publish(SampleCaptured.model_validate_json(event.payload))
            return [None] * len(events)
        outcomes = await bus.publish_many(broker, events)
        assert all(isinstance(error, bus.BusUnavailable) for error in outcomes)
        return outcomes

    pipeline = CapturePipeline(publish=publish, publish_many=nats_away, store=None,
                               spill=SpillFile(tmp_path / "spill.jsonl"),
                               can_publish=lambda: True)  # fmt: skip
    prepared = map_export(_export(3), PROTOBUF, None, "acme").prepared
    asyncio.run(pipeline.deliver_prepared(prepared))
    assert published == []
    assert pipeline.fidelity.drain() == []
    away = False
    assert asyncio.run(pipeline.replay()) == 3
    assert [(d.kind, d.added) for d in pipeline.fidelity.drain()] == [("samples", 3)]
    expected = [SampleCaptured.model_validate_json(p.event.payload).sample for p in prepared]
    assert [event.sample for event in published] == expected


def test_a_pipeline_given_only_publish_sends_prepared_samples_one_by_one(tmp_path: Path) -> None:
    published: list[SampleCaptured] = []

    async def publish(event: SampleCaptured) -> None:
        published.append(event)

    pipeline = CapturePipeline(publish=publish, store=None,
                               spill=SpillFile(tmp_path / "spill.jsonl"),
                               can_publish=lambda: True)  # fmt: skip
    prepared = map_export(_export(2), PROTOBUF, None, "acme").prepared
    asyncio.run(pipeline.deliver_prepared(prepared))
    assert [event.event_id for event in published] == [p.event.event_id for p in prepared]
    assert not pipeline.spill.pending()

"""The capture pipeline's keeping of what it cannot publish yet: samples too large for the bus go
by reference, the spill file is replayed as a stream in batches, and a call our code fails to
read is held for the next start instead of failing again every second."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path

import orjson
import pytest

from services.ingest.capture.call import CapturedCall
from services.ingest.capture.pipeline import CapturePipeline, sample_key
from services.ingest.capture.spill import SpillFile
from shared import bus
from shared.chat import Sample
from shared.events import SampleCaptured
from shared.storage import ObjectStore
from tests.fakes.upstream import recorded


class Bus:
    """publish_many as the pipeline sees it: every event stored, or (away) every one failed."""

    def __init__(self) -> None:
        self.away = False
        self.events: list[SampleCaptured] = []
        self.calls: list[int] = []  # events per publish_many call

    async def publish(self, event: SampleCaptured) -> None:
        self.events.append(event)

    async def publish_many(self, events: list[bus.EncodedEvent]) -> list[BaseException | None]:
        self.calls.append(len(events))
        if self.away:
            return [bus.BusUnavailable("not connected to NATS") for _ in events]
        self.events += [SampleCaptured.model_validate_json(e.payload) for e in events]
        return [None] * len(events)


def _pipeline(tmp_path: Path, nats: Bus, store: ObjectStore | None = None) -> CapturePipeline:
    return CapturePipeline(
        publish=nats.publish,
        publish_many=nats.publish_many,
        store=store,
        spill=SpillFile(tmp_path / "capture-spill.jsonl"),
        can_publish=lambda: not nats.away,
    )


def _sample(text: str, ref: str = "trace/1") -> Sample:
    return Sample.model_validate(
        {
            "tenant": "acme",
            "source": "otlp",
            "source_ref": ref,
            "created_at": datetime.now(UTC),
            "messages": [
                {"role": "user", "content": text},
                {"role": "assistant", "content": "noted"},
            ],
        }
    )


def test_a_sample_past_the_inline_limit_is_published_by_reference(
    tmp_path: Path, object_store: ObjectStore
) -> None:
    nats = Bus()
    pipeline = _pipeline(tmp_path, nats, object_store)
    big, small = _sample("x" * (2 * 1024**2), "trace/big"), _sample("hello", "trace/small")
    asyncio.run(pipeline.deliver_many([big, small]))
    by_ref, inline = nats.events
    assert by_ref.sample is None
    assert by_ref.sample_ref == object_store.uri(sample_key("acme", by_ref.event_id))
    assert Sample.model_validate_json(object_store.get_bytes(by_ref.sample_ref)) == big
    assert inline.sample == small
    assert [(d.kind, d.added) for d in pipeline.fidelity.drain()] == [("samples", 2)]


def test_a_sample_past_the_inline_limit_with_storage_away_is_spilled_then_stored(
    tmp_path: Path, object_store: ObjectStore
) -> None:
    nats = Bus()
    pipeline = _pipeline(tmp_path, nats, store=None)  # no object store: as if it were away
    big = _sample("x" * (2 * 1024**2))
    asyncio.run(pipeline.deliver_many([big]))
    assert nats.events == []
    assert pipeline.spill.pending()
    back = _pipeline(tmp_path, nats, object_store)
    assert asyncio.run(back.replay()) == 1
    [event] = nats.events
    assert event.sample_ref is not None
    assert not back.spill.pending()


def test_the_spill_file_is_replayed_in_batches_and_what_fails_again_is_kept(
    tmp_path: Path,
) -> None:
    nats = Bus()
    pipeline = _pipeline(tmp_path, nats)
    nats.away = True
    asyncio.run(pipeline.deliver_many([_sample(f"q{n}", f"trace/{n}") for n in range(600)]))
    assert len(nats.events) == 0
    assert pipeline.spill.pending()
    nats.away = False
    nats.calls.clear()
    assert asyncio.run(pipeline.replay()) == 600
    assert max(nats.calls) <= 256  # read and sent a batch at a time, not the whole file
    assert len({event.event_id for event in nats.events}) == 600
    assert not pipeline.spill.pending()


def test_a_failing_replay_writes_records_back_even_at_the_cap(tmp_path: Path) -> None:
    nats = Bus()
    pipeline = _pipeline(tmp_path, nats)
    pipeline.spill.max_bytes = 3000  # a couple of samples
    nats.away = True
    asyncio.run(pipeline.deliver_many([_sample(f"q{n}", f"trace/{n}") for n in range(10)]))
    kept = sum(1 for _ in pipeline.spill.records(pipeline.spill.path))
    assert 0 < kept < 10
    assert pipeline.refused == 10 - kept
    dropped = pipeline.fidelity.report("acme")["otlp"]["dropped"]
    assert dropped == {"capture spill full": 10 - kept}
    # NATS flaps during the replay: every record it claimed is written back, none refused.
    assert asyncio.run(pipeline.replay()) == kept
    assert pipeline.refused == 10 - kept
    [claimed] = pipeline.spill.claim()
    assert sum(1 for _ in pipeline.spill.records(claimed)) == kept


def test_a_call_our_code_cannot_read_is_held_for_the_next_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exchange = recorded("oa01_tool_calls_multiturn")
    call = CapturedCall(
        api="openai",
        tenant="acme",
        request_id="req-1",
        request_body=json.dumps(exchange["request"]["body"]).encode(),
        status=200,
        response_body=json.dumps(exchange["response"]["body"]).encode(),
        content_type="application/json",
        content_encoding="",
        started_at=datetime.now(UTC),
        latency_ms=3.0,
    )

    def broken(*_: object) -> None:
        raise RuntimeError("a bug of ours")

    nats = Bus()
    pipeline = _pipeline(tmp_path, nats)
    monkeypatch.setattr("services.ingest.capture.pipeline.normalize", broken)
    asyncio.run(pipeline.process(call))
    assert not pipeline.spill.pending()  # not retried every second by the spill loop
    assert pipeline.held.pending()
    [record] = (orjson.loads(line) for line in pipeline.held.path.read_bytes().splitlines())
    assert CapturedCall.from_record(record["payload"]) == call
    monkeypatch.undo()  # the fixed version starts

    async def next_start() -> None:
        fixed = _pipeline(tmp_path, nats)
        fixed._replay_interval_s = 0.01
        await fixed.start()
        for _ in range(200):
            if nats.events:
                break
            await asyncio.sleep(0.01)
        await fixed.stop()

    asyncio.run(next_start())
    assert [event.sample.source_ref for event in nats.events if event.sample] == ["req-1"]
    assert not pipeline.held.pending()

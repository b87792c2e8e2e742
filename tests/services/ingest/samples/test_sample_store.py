"""The sample store's write path: rows made straight from sample.captured bytes are the rows
`insert_samples` makes from validated samples, bad events are refused naming the field, the
bulk upsert is idempotent on SQLite and PostgreSQL, and the batched persister stores a stream
of events (and terminates a poison one) against a real nats-server."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from faststream._internal._compat import dump_json
from sqlalchemy import func, select
from sqlalchemy.engine import URL, Engine
from sqlmodel import Session

from services.ingest.capture.fidelity import Fidelity
from services.ingest.capture.pipeline import PreparedSample, sample_key
from services.ingest.handlers import sample_persister
from services.ingest.models import SampleRow, SampleTag
from services.ingest.samples.store import (
    BadSampleEvent,
    _row,
    get_sample,
    insert_rows,
    insert_samples,
    row_from_event,
)
from shared import bus, deadletters
from shared.chat import Sample
from shared.db import make_engine
from shared.events import SampleCaptured
from shared.settings import NatsSettings
from shared.storage import ObjectStore
from tests.plugins.infra import RunningProcess

NOW = datetime(2026, 3, 1, 12, 30, 15, 123456, tzinfo=UTC)


def _sample(tenant: str = "acme", ref: str = "trace/1", turns: int = 1, **extra: Any) -> Sample:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"question {turn}"})
        messages.append({"role": "assistant", "content": f"answer {turn}"})
    return Sample.model_validate(
        {
            "tenant": tenant,
            "source": "otlp",
            "source_ref": ref,
            "created_at": NOW,
            "messages": messages,
            **extra,
        }
    )


def _rich_sample() -> Sample:
    """Every kind of field the compaction has to get right: nested models with nulls left out,
    free-form dicts whose nulls are data, empty per-message defaults, floats, unicode."""
    return Sample.model_validate(
        {
            "tenant": "acme",
            "source": "gateway",
            "source_ref": "req-1",
            "created_at": NOW + timedelta(hours=2),
            "messages": [
                {"role": "system", "content": "Sé breve. 日本語"},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "what is this?"},
                        {"type": "image", "url": "https://example.com/cat.png"},
                    ],
                    "name": "ana",
                },
                {
                    "role": "assistant",
                    "content": [],
                    "tool_calls": [{"id": "c1", "name": "look", "arguments": '{"q": null}'}],
                    "reasoning": [{"text": "the user wants a lookup"}],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "a cat", "is_error": True},
                {"role": "assistant", "content": "A cat.", "weight": 1},
            ],
            "tools": [
                {
                    "name": "look",
                    "description": "Look something up.",
                    "parameters": {"type": "object", "default": None, "properties": {}},
                }
            ],
            "params": {"temperature": 0.1, "response_format": {"type": "json", "schema": None}},
            "response": {
                "provider": "openai",
                "model_requested": "gpt-4o-mini",
                "latency_ms": 12.5,
                "usage": {"input_tokens": 10, "output_tokens": 3, "total_tokens": 13},
                "finish_reason": "stop",
            },
            "tags": ["a", "b", "a"],
            "metadata": {"service.name": "shop", "none": None, "ratio": 0.25, "ok": True},
        }
    )


def _event_bytes(sample: Sample) -> tuple[bytes, str]:
    """The message body exactly as `bus.publish` sends it (FastStream's encoder), its subject."""
    event = SampleCaptured(tenant=sample.tenant, event_id=f"{sample.id}-1", sample=sample)
    return dump_json(event), event.subject


def _prepared_bytes(sample: Sample) -> tuple[bytes, str]:
    """The message body as the capture pipeline publishes it (no None fields), its subject."""
    event = PreparedSample.of(sample).event
    return event.payload, event.subject


@pytest.mark.parametrize("encode", [_event_bytes, _prepared_bytes], ids=["faststream", "capture"])
@pytest.mark.parametrize("make", [_sample, _rich_sample], ids=["plain", "rich"])
def test_a_row_from_event_bytes_is_the_row_from_the_validated_sample(
    make: Callable[[], Sample], encode: Callable[[Sample], tuple[bytes, str]]
) -> None:
    sample = make()
    data, subject = encode(sample)
    # The capture encoding of the plain sample holds no null (the persister's fast path); the
    # rich one's metadata holds a null that is data and must be kept.
    assert (b"null" in data) == (encode is _event_bytes or make is _rich_sample)
    row = row_from_event(data, subject)
    assert row == _row(sample)
    assert row["body"] == sample.to_json_bytes()  # byte for byte: compact, same key order
    assert Sample.from_json_bytes(row["body"]) == sample


def _bad(event: dict[str, Any]) -> bytes:
    return orjson.dumps(event)


def _good_event() -> dict[str, Any]:
    return orjson.loads(_event_bytes(_sample())[0])


def _with(path: str, value: Any) -> bytes:
    event = _good_event()
    target = event
    *parents, last = path.split(".")
    for key in parents:
        target = target[key]
    target[last] = value
    return _bad(event)


SUBJECT = SampleCaptured.subject_for("acme")


@pytest.mark.parametrize(
    ("data", "subject", "names"),
    [
        (b"{not json", SUBJECT, "event: not JSON"),
        (b"[1, 2]", SUBJECT, "event: must be an object"),
        (_bad(_good_event()), SampleCaptured.subject_for("other"), "subject"),
        (_with("tenant", "Not A Tenant"), SUBJECT, "tenant:"),
        (_with("schema_version", 2), SUBJECT, "schema_version: 2"),
        (_with("sample", "text"), SUBJECT, "sample: must be an object"),
        (_with("sample.tenant", "other"), SUBJECT, "sample.tenant 'other' differs"),
        (_with("sample.schema_version", 9), SUBJECT, "sample.schema_version: 9"),
        (_with("sample.messages", []), SUBJECT, "sample.messages: must be a non-empty array"),
        (_with("sample.id", ""), SUBJECT, "sample.id: must be a non-empty string"),
        (_with("sample.source", "email"), SUBJECT, "sample.source: 'email'"),
        (_with("sample.created_at", "2026-03-01T12:00:00"), SUBJECT, "sample.created_at"),
        (_with("sample.created_at", "yesterday"), SUBJECT, "sample.created_at"),
        (_with("sample.response", {"model": 5}), SUBJECT, "sample.response.model"),
        (_with("sample.tags", ["ok", 3]), SUBJECT, "sample.tags"),
    ],
)
def test_an_event_the_store_cannot_take_is_refused_naming_the_field(
    data: bytes, subject: str, names: str
) -> None:
    with pytest.raises(BadSampleEvent, match=names.replace(".", r"\.")):
        row_from_event(data, subject)


def _count(session: Session, table: Any) -> int:
    return int(session.execute(select(func.count()).select_from(table)).scalar_one())


def test_bulk_upsert_is_idempotent_and_keeps_the_longest_conversation(db_engine: Engine) -> None:
    short, longer = _sample(turns=1), _sample(turns=3)
    other = _sample(ref="trace/2", tags=["x"])
    assert short.id == longer.id
    with Session(db_engine) as session:
        rows = [row_from_event(*_event_bytes(s)) for s in (short, other, short)]
        assert insert_rows(session, rows) == 2
        assert insert_rows(session, rows) == 0  # a redelivered batch changes nothing
        assert insert_samples(session, [longer, other]) == 1  # the grown conversation replaces
        assert insert_rows(session, [row_from_event(*_event_bytes(short))]) == 0  # never shrinks
        assert _count(session, SampleRow) == 2
        assert _count(session, SampleTag) == 1
        stored = get_sample(session, tenant="acme", sample_id=short.id)
    assert stored == longer


def test_a_batch_of_hundreds_goes_in_at_once(db_engine: Engine) -> None:
    samples = [_sample(ref=f"trace/{i}", tags=["bulk"]) for i in range(600)]
    rows = [row_from_event(*_event_bytes(s)) for s in samples]
    with Session(db_engine) as session:
        assert insert_rows(session, rows) == 600
        assert _count(session, SampleRow) == 600
        assert _count(session, SampleTag) == 600


def test_stored_times_compare_with_times_sqlalchemy_binds(db_engine: Engine) -> None:
    # The upsert binds its parameters itself (no SQLAlchemy per row): its times must be stored in
    # the format SQLAlchemy writes and compares with, or ranges and keyset order go wrong.
    # Whole seconds: where a driver's own format differs from SQLAlchemy's, it is in how those
    # are written ("12:30:18+00:00" against "12:30:18.000000"), and an equal bound then misses.
    start = NOW.replace(microsecond=0)
    samples = [_sample(ref=f"trace/{i}", created_at=start + timedelta(seconds=i)) for i in range(5)]
    before = datetime.now(UTC)
    with Session(db_engine) as session:
        insert_rows(session, [row_from_event(*_event_bytes(s)) for s in samples])
        later = select(SampleRow.id).where(SampleRow.created_at >= start + timedelta(seconds=3))
        assert set(session.execute(later).scalars()) == {s.id for s in samples[3:]}
        rows = session.execute(select(SampleRow).order_by(SampleRow.created_at)).scalars().all()
    assert [row.created_at for row in rows] == [s.created_at for s in samples]
    assert all(before <= row.ingested_at <= datetime.now(UTC) for row in rows)


async def test_the_persister_stores_events_and_terminates_a_poison_one(
    private_nats: RunningProcess,
    sqlite_url: URL,
    object_store: ObjectStore,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A server of its own: the persister's durable consumer is the one every ingest process
    # of the test session shares on the session server.
    nats = NatsSettings(url=f"nats://127.0.0.1:{private_nats.component.ports[0].number}")
    db_engine = make_engine(sqlite_url)
    tenant = f"t{uuid.uuid4().hex[:10]}"
    broker = bus.make_broker(nats, service="persister-test")
    await bus.connect(broker, nats)
    await bus.declare_streams(broker.connection, nats)
    fidelity = Fidelity()
    persister = sample_persister(
        broker=broker, engine=db_engine, store=object_store, fidelity=fidelity
    )
    caplog.set_level(logging.WARNING, logger="tuneloop.bus")
    samples = [_sample(tenant=tenant, ref=f"trace/{i}") for i in range(50)]
    try:
        await persister.start()
        js = broker.connection.jetstream()
        # A body no producer of ours writes: terminated, logged, and the rest still stored.
        await js.publish(SampleCaptured.subject_for(tenant), b'{"tenant": "' + tenant.encode())
        await asyncio.gather(
            *(
                bus.publish(broker, SampleCaptured(tenant=tenant, event_id=s.id, sample=s))
                for s in samples
            )
        )

        def stored() -> int:
            with Session(db_engine) as session:
                statement = select(func.count()).where(SampleRow.tenant == tenant)
                return int(session.execute(statement).scalar_one())

        async with asyncio.timeout(20):
            while stored() < len(samples):
                await asyncio.sleep(0.05)
        assert "terminated" in caplog.text
        assert "event: not JSON" in caplog.text
        # Kept in the dead-letter stream, and counted in the tenant's fidelity report.
        (letter,) = await deadletters.list_dead_letters(js, tenant=tenant)
        assert letter.reason.startswith("event: not JSON")
        dropped = fidelity.report(tenant)["unknown"]["dropped"]
        assert list(dropped) == [f"dead-lettered: {letter.reason}"]
    finally:
        await persister.stop()
        await broker.stop()
    with Session(db_engine) as session:
        assert get_sample(session, tenant=tenant, sample_id=samples[7].id) == samples[7]


def _by_reference(sample: Sample, store: ObjectStore, *, key: str | None = None) -> SampleCaptured:
    """The event of a sample kept in object storage (what the pipeline publishes for one past
    the inline limit); `key` puts it elsewhere."""
    key = key or sample_key(sample.tenant, sample.id)
    store.put_bytes(key, sample.to_json_bytes(), content_type="application/json")
    return SampleCaptured(tenant=sample.tenant, event_id=sample.id, sample_ref=store.uri(key))


def test_an_event_carries_its_sample_or_a_reference_never_both_nor_neither() -> None:
    sample = _sample()
    with pytest.raises(ValueError, match="exactly one of sample and sample_ref"):
        SampleCaptured(tenant="acme", sample=sample, sample_ref="s3://b/k")
    with pytest.raises(ValueError, match="exactly one of sample and sample_ref"):
        SampleCaptured(tenant="acme")


def test_a_reference_outside_the_tenants_samples_is_refused_naming_it() -> None:
    event = SampleCaptured(tenant="acme", sample_ref="s3://bucket/tenants/other/samples/x.json")
    with pytest.raises(BadSampleEvent, match=r"sample_ref: .* is not one of acme's samples"):
        row_from_event(*_event_bytes_of(event))


def _event_bytes_of(event: SampleCaptured) -> tuple[bytes, str]:
    encoded = bus.encode(event, exclude_none=True)
    return encoded.payload, encoded.subject


async def test_the_persister_reads_a_sample_published_by_reference(
    private_nats: RunningProcess, sqlite_url: URL, object_store: ObjectStore
) -> None:
    nats = NatsSettings(url=f"nats://127.0.0.1:{private_nats.component.ports[0].number}")
    db_engine = make_engine(sqlite_url)
    tenant = f"t{uuid.uuid4().hex[:10]}"
    broker = bus.make_broker(nats, service="persister-test")
    await bus.connect(broker, nats)
    await bus.declare_streams(broker.connection, nats)
    fidelity = Fidelity()
    persister = sample_persister(
        broker=broker, engine=db_engine, store=object_store, fidelity=fidelity
    )
    big = _sample(tenant=tenant, ref="trace/big", turns=400)
    kept = _sample(tenant=tenant, ref="trace/kept")
    gone = _sample(tenant=tenant, ref="trace/gone")
    missing = _by_reference(gone, object_store)
    object_store.delete(sample_key(tenant, gone.id))  # removed by hand after publishing
    events = [_by_reference(big, object_store), missing, SampleCaptured(tenant=tenant, sample=kept)]
    try:
        await persister.start()
        assert await bus.publish_many(broker, events) == [None, None, None]

        def stored() -> set[str]:
            with Session(db_engine) as session:
                rows = select(SampleRow.id).where(SampleRow.tenant == tenant)
                return set(session.execute(rows).scalars())

        async with asyncio.timeout(20):
            while stored() != {big.id, kept.id}:
                await asyncio.sleep(0.05)
        # The one whose object is gone is counted, not retried forever, and not stored.
        async with asyncio.timeout(10):
            while not fidelity.report(tenant):
                await asyncio.sleep(0.05)
        [reason] = fidelity.report(tenant)["unknown"]["dropped"]
        assert reason.startswith("sample by reference: ")
        assert "no such object" in reason
    finally:
        await persister.stop()
        await broker.stop()
    with Session(db_engine) as session:
        assert get_sample(session, tenant=tenant, sample_id=big.id) == big

"""bus.consume_batches against a real nats-server: batches, acks, retries, poison messages, and
no stall when a pull comes back short or empty (FastStream 0.7.8's batch loop did stall)."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable

import pytest
from faststream.nats import NatsBroker

from shared import bus
from shared.events import JOBS, JobQueued
from shared.settings import NatsSettings, Settings
from tests.plugins.infra import RunningProcess
from tests.plugins.waiting import eventually

FAST = bus.BatchOptions(batch_size=16, fetch_timeout_s=0.2, retry_delay_s=0.1)


@pytest.fixture
def nats_settings(nats_server: RunningProcess, stack_settings: Settings) -> NatsSettings:
    return stack_settings.nats


async def _started(settings: NatsSettings, service: str) -> NatsBroker:
    broker = bus.make_broker(settings, service=service)
    await bus.connect(broker, settings)
    await bus.declare_streams(broker.connection, settings)
    return broker


def _decode_for(tenant: str) -> bus.Decode[JobQueued | None]:
    """Events of this test's tenant; other tests' events on the shared server are skipped."""

    def decode(data: bytes, subject: str) -> JobQueued | None:
        event = JobQueued.model_validate_json(data)
        return event if event.tenant == tenant else None

    return decode


async def _publish(broker: NatsBroker, tenant: str, positions: range) -> None:
    await asyncio.gather(
        *(bus.publish(broker, JobQueued(tenant=tenant, job_id="j", position=p)) for p in positions)
    )


async def _consumer_state(broker: NatsBroker, service: str) -> tuple[int, int]:
    """(messages not yet delivered, delivered but not acked) of the service's durable."""
    info = await broker.connection.jetstream().consumer_info(
        JOBS.name, bus.durable_name(service, JobQueued)
    )
    return info.num_pending or 0, info.num_ack_pending or 0


async def _settled(broker: NatsBroker, service: str, timeout_s: float = 5.0) -> bool:
    """True once every message was delivered and acked (acks follow the handler by a moment)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while await _consumer_state(broker, service) != (0, 0):
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


def _consumer(
    broker: NatsBroker,
    service: str,
    decode: bus.Decode[JobQueued | None],
    handle: Callable[[list[JobQueued | None]], Awaitable[None]],
) -> bus.BatchConsumer[JobQueued | None]:
    return bus.consume_batches(
        broker, JobQueued, service=service, decode=decode, handle=handle, options=FAST
    )


async def test_events_arrive_in_batches_once_each_and_are_acked(
    nats_settings: NatsSettings,
) -> None:
    tenant, service = f"t{uuid.uuid4().hex[:10]}", f"svc{uuid.uuid4().hex[:6]}"
    broker = await _started(nats_settings, "batches")
    batches: list[list[int]] = []

    async def handle(events: list[JobQueued | None]) -> None:
        batches.append([e.position for e in events if e is not None])

    consumer = _consumer(broker, service, _decode_for(tenant), handle)
    try:
        await _publish(broker, tenant, range(40))  # a backlog before the consumer starts
        await consumer.start()
        await eventually(lambda: sum(map(len, batches)) >= 40)
        # Quiet for several fetch timeouts (empty pulls), then more: the loop must still run.
        await asyncio.sleep(1.0)
        await _publish(broker, tenant, range(40, 43))
        await eventually(lambda: sum(map(len, batches)) >= 43)
        seen = [p for batch in batches for p in batch]
        assert sorted(seen) == list(range(43))
        assert max(map(len, batches)) > 1, batches  # the backlog came in batches
        assert max(map(len, batches)) <= FAST.batch_size
        assert await _settled(broker, service)
    finally:
        await consumer.stop()
        await broker.stop()


async def test_a_failing_batch_is_retried_message_by_message(
    nats_settings: NatsSettings, caplog: pytest.LogCaptureFixture
) -> None:
    """One message that keeps failing does not hold back the rest; it is redelivered."""
    tenant, service = f"t{uuid.uuid4().hex[:10]}", f"svc{uuid.uuid4().hex[:6]}"
    broker = await _started(nats_settings, "batches")
    stored: set[int] = set()
    failures: list[int] = []

    async def handle(events: list[JobQueued | None]) -> None:
        positions = [e.position for e in events if e is not None]
        if 3 in positions and len(failures) < 3:
            failures.append(len(positions))
            raise RuntimeError("row 3 violates a constraint")
        stored.update(positions)

    await _publish(broker, tenant, range(8))
    consumer = _consumer(broker, service, _decode_for(tenant), handle)
    caplog.set_level(logging.WARNING, logger="tuneloop.bus")
    await consumer.start()
    try:
        await eventually(lambda: stored == set(range(8)))
        assert failures[0] > 1  # the batch failed as a whole first...
        assert 1 in failures  # ...then message 3 alone, while the others were stored
        assert "nacked for redelivery" in caplog.text
        assert "RuntimeError: row 3 violates a constraint" in caplog.text
        assert await _settled(broker, service)
    finally:
        await consumer.stop()
        await broker.stop()


async def test_a_poison_message_is_terminated_with_its_reason(
    nats_settings: NatsSettings, caplog: pytest.LogCaptureFixture
) -> None:
    tenant, service = f"t{uuid.uuid4().hex[:10]}", f"svc{uuid.uuid4().hex[:6]}"
    broker = await _started(nats_settings, "batches")
    handled: list[int] = []
    decoded: list[int] = []

    def decode(data: bytes, subject: str) -> JobQueued | None:
        event = _decode_for(tenant)(data, subject)
        if event is not None:
            decoded.append(event.position)
            if event.position == 1:
                raise bus.PoisonMessage("position: 1 is not a position this consumer takes")
        return event

    async def handle(events: list[JobQueued | None]) -> None:
        handled.extend(e.position for e in events if e is not None)

    await _publish(broker, tenant, range(3))
    consumer = _consumer(broker, service, decode, handle)
    caplog.set_level(logging.WARNING, logger="tuneloop.bus")
    await consumer.start()
    try:
        await eventually(lambda: sorted(handled) == [0, 2])
        await asyncio.sleep(0.5)  # a nack or an expired ack would bring it back by now
        assert decoded.count(1) == 1
        assert "terminated" in caplog.text
        assert "position: 1 is not a position this consumer takes" in caplog.text
        assert await _settled(broker, service)
    finally:
        await consumer.stop()
        await broker.stop()


async def test_a_restarted_consumer_carries_on_from_the_durable(
    nats_settings: NatsSettings,
) -> None:
    tenant, service = f"t{uuid.uuid4().hex[:10]}", f"svc{uuid.uuid4().hex[:6]}"
    broker = await _started(nats_settings, "batches")
    seen: list[int] = []

    async def handle(events: list[JobQueued | None]) -> None:
        seen.extend(e.position for e in events if e is not None)

    first = _consumer(broker, service, _decode_for(tenant), handle)
    await first.start()
    try:
        await _publish(broker, tenant, range(5))
        await eventually(lambda: len(seen) >= 5)
        await first.stop()
        await _publish(broker, tenant, range(5, 9))  # while no one consumes
        second = _consumer(broker, service, _decode_for(tenant), handle)
        await second.start()
        await eventually(lambda: len(seen) >= 9)
        await second.stop()
        assert sorted(seen) == list(range(9))
    finally:
        await first.stop()
        await broker.stop()


# --- bundles: several events of a bundled class in one message ---------------------------------


class _BundledJob(JobQueued):
    """JobQueued as a bundled class would send it (same subject and JSON): the bundling is the
    bus's, whatever the event."""

    bundled = True


def _encoded(tenant: str, positions: range, *, pad: int = 0) -> list[bus.EncodedEvent]:
    return [
        bus.encode(_BundledJob(tenant=tenant, job_id="j" * (1 + pad), position=p))
        for p in positions
    ]


def test_bundles_pack_events_of_one_subject_up_to_the_size_limit() -> None:
    first, second = _encoded("acme", range(5)), _encoded("other", range(5, 7))
    plain = bus.encode(JobQueued(tenant="acme", job_id="j", position=9))
    huge = _encoded("acme", range(10, 11), pad=3000)
    events = [*first[:3], plain, *second, *first[3:], *huge]
    size = len(first[0].payload) + 1
    messages = bus.bundles(events, max_bytes=size * 4)
    # The plain event and the oversized one alone; acme's five in bundles of four and one.
    held = sorted((members for _, members in messages), key=min)
    assert held == [[0, 1, 2, 6], [3], [4, 5], [7], [8]]
    by_members = {tuple(members): message for message, members in messages}
    bundle = by_members[(0, 1, 2, 6)]
    assert bundle.headers[bus.BUNDLE_HEADER] == "4"
    assert bundle.payload.split(b"\n") == [events[i].payload for i in (0, 1, 2, 6)]
    assert bundle.headers["Nats-Msg-Id"] == bundle.event_id != events[0].event_id
    assert by_members[(3,)] is plain
    assert by_members[(8,)] is huge[0]
    assert by_members[(7,)] is first[4]  # a bundle of one is the event's own message
    # The same events bundle to the same message id: a resend is dropped as a duplicate.
    again = bus.bundles(events, max_bytes=size * 4)
    assert {m.event_id for m, _ in again} == {m.event_id for m, _ in messages}


async def test_bundled_events_travel_in_few_messages_and_arrive_once_each(
    nats_settings: NatsSettings,
) -> None:
    tenant, service = f"t{uuid.uuid4().hex[:10]}", f"svc{uuid.uuid4().hex[:6]}"
    broker = await _started(nats_settings, "bundles")
    batches: list[list[int]] = []

    async def handle(events: list[JobQueued | None]) -> None:
        batches.append([e.position for e in events if e is not None])

    js = broker.connection.jetstream()
    before = (await js.stream_info(JOBS.name)).state.messages
    events = _encoded(tenant, range(30))
    assert await bus.publish_many(broker, events) == [None] * 30
    assert (await js.stream_info(JOBS.name)).state.messages == before + 1
    assert await bus.publish_many(broker, events) == [None] * 30  # a resend: a duplicate
    assert (await js.stream_info(JOBS.name)).state.messages == before + 1
    consumer = _consumer(broker, service, _decode_for(tenant), handle)
    await consumer.start()
    try:
        await eventually(lambda: sum(map(len, batches)) >= 30)
        await asyncio.sleep(0.3)  # room for a redelivery to show up
        assert sorted(p for batch in batches for p in batch) == list(range(30))
        assert await _settled(broker, service)
    finally:
        await consumer.stop()
        await broker.stop()


async def test_a_poison_event_in_a_bundle_is_dropped_and_the_rest_handled(
    nats_settings: NatsSettings, caplog: pytest.LogCaptureFixture
) -> None:
    tenant, service = f"t{uuid.uuid4().hex[:10]}", f"svc{uuid.uuid4().hex[:6]}"
    broker = await _started(nats_settings, "bundles")
    handled: list[int] = []

    def decode(data: bytes, subject: str) -> JobQueued | None:
        event = _decode_for(tenant)(data, subject)
        if event is not None and event.position == 2:
            raise bus.PoisonMessage("position: 2 is not a position this consumer takes")
        return event

    async def handle(events: list[JobQueued | None]) -> None:
        handled.extend(e.position for e in events if e is not None)

    assert await bus.publish_many(broker, _encoded(tenant, range(4))) == [None] * 4
    consumer = _consumer(broker, service, decode, handle)
    caplog.set_level(logging.WARNING, logger="tuneloop.bus")
    await consumer.start()
    try:
        await eventually(lambda: sorted(handled) == [0, 1, 3])
        assert await _settled(broker, service)  # acked: the others are not delivered again
        assert "1 of the 4 events in message" in caplog.text
        assert "event 3: position: 2 is not a position this consumer takes" in caplog.text
    finally:
        await consumer.stop()
        await broker.stop()


async def test_a_bundle_whose_count_does_not_match_its_payload_is_terminated(
    nats_settings: NatsSettings, caplog: pytest.LogCaptureFixture
) -> None:
    tenant, service = f"t{uuid.uuid4().hex[:10]}", f"svc{uuid.uuid4().hex[:6]}"
    broker = await _started(nats_settings, "bundles")
    handled: list[int] = []

    async def handle(events: list[JobQueued | None]) -> None:
        handled.extend(e.position for e in events if e is not None)

    ((bundle, _),) = bus.bundles(_encoded(tenant, range(3)))
    headers = bundle.headers | {bus.BUNDLE_HEADER: "4"}
    await broker.connection.jetstream().publish(bundle.subject, bundle.payload, headers=headers)
    await _publish(broker, tenant, range(3, 4))
    consumer = _consumer(broker, service, _decode_for(tenant), handle)
    caplog.set_level(logging.WARNING, logger="tuneloop.bus")
    await consumer.start()
    try:
        await eventually(lambda: handled == [3])
        assert await _settled(broker, service)
        assert "terminated" in caplog.text
        assert "tuneloop-bundle: says 4 events, the payload has 3" in caplog.text
    finally:
        await consumer.stop()
        await broker.stop()


async def test_a_failing_bundle_is_retried_whole_while_other_messages_are_stored(
    nats_settings: NatsSettings,
) -> None:
    tenant, service = f"t{uuid.uuid4().hex[:10]}", f"svc{uuid.uuid4().hex[:6]}"
    broker = await _started(nats_settings, "bundles")
    stored: set[int] = set()
    attempts: list[list[int]] = []

    async def handle(events: list[JobQueued | None]) -> None:
        positions = sorted(e.position for e in events if e is not None)
        if 11 in positions:
            attempts.append(positions)
            if len(attempts) < 3:
                raise RuntimeError("the database is briefly away")
        stored.update(positions)

    await _publish(broker, tenant, range(3))  # three messages of one event
    assert await bus.publish_many(broker, _encoded(tenant, range(10, 13))) == [None] * 3
    consumer = _consumer(broker, service, _decode_for(tenant), handle)
    await consumer.start()
    try:
        await eventually(lambda: stored == {0, 1, 2, 10, 11, 12})
        # Whatever the first fetch held, the bundle's events were always handled together,
        # and after the batch failed the bundle was retried on its own.
        assert {10, 11, 12} <= set(attempts[0])
        assert attempts[1:] == [[10, 11, 12]] * 2
        assert await _settled(broker, service)
    finally:
        await consumer.stop()
        await broker.stop()


def test_a_bundled_event_class_cannot_be_subscribed_one_message_per_event() -> None:
    with pytest.raises(ValueError, match="may arrive in bundles; use consume_batches"):
        bus.subscribe(NatsBroker(), _BundledJob, service="svc")

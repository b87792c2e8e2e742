"""The delivery policy of both consumption paths: recoverable faults retried without limit, with
capped exponential backoff; messages that can never be handled dead-lettered, then terminated.
FastStream's `subscribe` path against a real nats-server (its in-memory broker does nothing on
ack, nak or term)."""

from __future__ import annotations

import asyncio
import json
import uuid

import pydantic
import pytest
from faststream.nats import NatsBroker
from nats.js.api import ConsumerConfig

from shared import bus, deadletters, redelivery
from shared.events import DEADLETTERS, JOBS, JobQueued
from shared.settings import NatsSettings, Settings
from tests.plugins.infra import RunningProcess
from tests.plugins.waiting import eventually

FAST = bus.RetryPolicy(first_delay_s=0.01, max_delay_s=0.05)


@pytest.fixture
def nats_settings(nats_server: RunningProcess, stack_settings: Settings) -> NatsSettings:
    return stack_settings.nats


async def _started(settings: NatsSettings, service: str) -> NatsBroker:
    broker = bus.make_broker(settings, service=service)
    await bus.connect(broker, settings)
    await bus.declare_streams(broker.connection, settings)
    return broker


def _ids() -> tuple[str, str]:
    return f"t{uuid.uuid4().hex[:10]}", f"svc{uuid.uuid4().hex[:6]}"


def test_the_backoff_doubles_from_the_first_delay_up_to_the_cap() -> None:
    policy = bus.RetryPolicy(first_delay_s=1.0, max_delay_s=30.0)
    assert [policy.delay_s(n) for n in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]
    assert policy.delay_s(10_000) == 30.0  # no overflow however long the outage
    assert policy.delay_s(0) == 1.0  # a message of no delivery count: the first delay
    assert bus.RetryPolicy(0.5, 60.0).delay_s(8) == 60.0


def test_only_a_message_that_can_never_be_handled_is_permanent() -> None:
    with pytest.raises(pydantic.ValidationError) as invalid:
        JobQueued.model_validate({"tenant": "acme"})
    with pytest.raises(json.JSONDecodeError) as undecodable:
        json.loads(b"{not json")
    assert redelivery.is_permanent(invalid.value)
    assert redelivery.is_permanent(undecodable.value)
    assert redelivery.is_permanent(bus.PermanentError("schema version 9 is not known"))
    assert redelivery.is_permanent(bus.PoisonMessage("sample.messages: must be non-empty"))
    for recoverable in (
        ConnectionRefusedError("database refused"),
        TimeoutError(),
        RuntimeError("database is locked"),
        OSError("disk I/O error"),
    ):
        assert not redelivery.is_permanent(recoverable)


async def test_a_subscriber_retries_a_recoverable_fault_beyond_ten_deliveries(
    nats_settings: NatsSettings,
) -> None:
    """Today's deployments had max_deliver 10: an outage longer than ten retries lost events."""
    tenant, service = _ids()
    broker = await _started(nats_settings, "consumer")
    attempts: list[int] = []
    handled: list[int] = []

    @bus.subscribe(broker, JobQueued, service=service, retry=FAST)
    async def flaky(event: JobQueued) -> None:
        if event.tenant != tenant:
            return
        attempts.append(event.position)
        if len(attempts) <= 14:
            raise ConnectionRefusedError("the database refused the connection")
        handled.append(event.position)

    await broker.start()
    try:
        await bus.publish(broker, JobQueued(tenant=tenant, job_id="j", position=7))
        await eventually(lambda: handled == [7], 15)
        assert attempts == [7] * 15
        info = await broker.connection.jetstream().consumer_info(
            JOBS.name, bus.durable_name(service, JobQueued)
        )
        assert info.config.max_deliver == -1
        assert (info.num_ack_pending, info.num_pending) == (0, 0)  # acked at last
    finally:
        await broker.stop()


async def test_an_invalid_event_is_dead_lettered_then_terminated(
    nats_settings: NatsSettings,
) -> None:
    tenant, service = _ids()
    broker = await _started(nats_settings, "consumer")
    seen: list[int] = []

    @bus.subscribe(broker, JobQueued, service=service, retry=FAST)
    async def record(event: JobQueued) -> None:
        if event.tenant == tenant:
            if event.position == 2:
                raise bus.PermanentError("position 2: no such queue slot")
            seen.append(event.position)

    await broker.start()
    js = broker.connection.jetstream()
    subject = JobQueued.subject_for(tenant)
    try:
        # Not a JobQueued: no job_id. Then one the handler refuses, then a good one.
        await js.publish(subject, json.dumps({"tenant": tenant, "position": 1}).encode())
        await bus.publish(broker, JobQueued(tenant=tenant, job_id="j", position=2))
        await bus.publish(broker, JobQueued(tenant=tenant, job_id="j", position=3))
        await eventually(lambda: seen == [3], 15)
        letters: list[deadletters.DeadLetter] = []

        async def dead_lettered() -> None:
            while len(letters) < 2:
                letters[:] = await deadletters.list_dead_letters(js, tenant=tenant)
                await asyncio.sleep(0.05)

        await asyncio.wait_for(dead_lettered(), 10)
        invalid, refused = letters
        assert invalid.subject == refused.subject == subject
        assert invalid.stream == JOBS.name
        assert invalid.consumer == bus.durable_name(service, JobQueued)
        assert invalid.reason.startswith("ValidationError")
        assert "job_id" in invalid.reason
        assert refused.reason == "PermanentError: position 2: no such queue slot"
        assert refused.deliveries == invalid.deliveries == 1  # never retried
        assert json.loads(refused.data)["position"] == 2
        info = await js.consumer_info(JOBS.name, bus.durable_name(service, JobQueued))
        assert (info.num_ack_pending, info.num_pending) == (0, 0)  # terminated, not pending
    finally:
        await broker.stop()


async def test_a_handler_that_settles_the_message_itself_is_left_alone(
    nats_settings: NatsSettings,
) -> None:
    """The dataset worker nacks with a delay of its own choosing and returns."""
    from faststream.nats.annotations import NatsMessage

    tenant, service = _ids()
    broker = await _started(nats_settings, "consumer")
    deliveries: list[int] = []

    @bus.subscribe(broker, JobQueued, service=service, retry=FAST)
    async def later(event: JobQueued, msg: NatsMessage) -> None:
        if event.tenant != tenant:
            return
        deliveries.append(msg.raw_message.metadata.num_delivered)
        if len(deliveries) < 3:
            await msg.nack(delay=0.05)

    await broker.start()
    try:
        await bus.publish(broker, JobQueued(tenant=tenant, job_id="j", position=0))
        await eventually(lambda: len(deliveries) == 3, 15)
        await asyncio.sleep(0.3)  # room for a fourth, were the last not acked
        assert deliveries == [1, 2, 3]
    finally:
        await broker.stop()


async def test_start_up_brings_an_existing_durable_to_the_declared_config(
    nats_settings: NatsSettings,
) -> None:
    """A durable made by an older release keeps max_deliver 10 unless start-up updates it."""
    tenant, service = _ids()
    durable = bus.durable_name(service, JobQueued)
    broker = await _started(nats_settings, "consumer")
    js = broker.connection.jetstream()
    old = ConsumerConfig(
        durable_name=durable,
        max_deliver=10,
        ack_wait=60.0,
        filter_subject=JobQueued.subject_pattern(),
    )
    await js.add_consumer(JOBS.name, old)
    await broker.stop()

    broker = bus.make_broker(nats_settings, service="consumer")

    @bus.subscribe(broker, JobQueued, service=service)
    async def ignore(event: JobQueued) -> None:
        pass

    await bus.connect(broker, nats_settings)
    await bus.declare_streams(broker.connection, nats_settings)
    try:
        info = await broker.connection.jetstream().consumer_info(JOBS.name, durable)
        assert info.config.max_deliver == -1
        assert info.config.filter_subject == JobQueued.subject_pattern()
    finally:
        await broker.stop()
    assert tenant  # the durable is this test's own


async def test_a_failed_dead_letter_copy_keeps_the_message(
    nats_settings: NatsSettings,
) -> None:
    """No dead-letter stream (a server from before this release): the message is nacked, not
    terminated, so nothing is lost before the stream exists."""
    tenant, service = _ids()
    broker = await _started(nats_settings, "consumer")
    js = broker.connection.jetstream()
    await js.delete_stream(DEADLETTERS.name)
    deliveries: list[int] = []

    @bus.subscribe(broker, JobQueued, service=service, retry=FAST)
    async def refuse(event: JobQueued) -> None:
        if event.tenant == tenant:
            deliveries.append(event.position)
            raise bus.PermanentError("never")

    await broker.start()
    try:
        await bus.publish(broker, JobQueued(tenant=tenant, job_id="j", position=0))
        await eventually(lambda: len(deliveries) >= 3, 15)
        await bus.declare_streams(broker.connection, nats_settings)  # the stream is back
        letters: list[deadletters.DeadLetter] = []

        async def dead_lettered() -> None:
            while not letters:
                letters[:] = await deadletters.list_dead_letters(js, tenant=tenant)
                await asyncio.sleep(0.05)

        await asyncio.wait_for(dead_lettered(), 10)
        assert letters[0].deliveries >= 3
    finally:
        await broker.stop()

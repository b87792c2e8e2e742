"""The bus against a real nats-server with JetStream: streams, publish, durable consumption, redelivery."""

import asyncio
import dataclasses
import logging
import uuid
from pathlib import Path

import nats
import pytest
from faststream.nats import NatsBroker

from shared import bus
from shared.chat import Sample
from shared.dev import localstack
from shared.events import JOBS, SAMPLES, STREAMS, JobQueued, SampleCaptured
from shared.settings import NatsSettings, Settings
from tests.plugins.infra import RunningProcess, free_port, make_settings
from tests.plugins.waiting import eventually


@pytest.fixture
def nats_settings(nats_server: RunningProcess, stack_settings: Settings) -> NatsSettings:
    return stack_settings.nats


def _tenant() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


async def _started(settings: NatsSettings, service: str) -> NatsBroker:
    broker = bus.make_broker(settings, service=service)
    await bus.connect(broker, settings)
    await bus.declare_streams(broker.connection, settings)
    return broker


async def test_streams_are_declared_with_limits_and_redeclaring_is_harmless(
    nats_settings: NatsSettings,
) -> None:
    nc = await nats.connect(nats_settings.url)
    try:
        js = nc.jetstream()
        await bus.declare_streams(nc, nats_settings)
        await bus.declare_streams(nc, nats_settings)  # a second service starting up
        for stream in STREAMS:
            info = await js.stream_info(stream.name)
            assert info.config.subjects == stream.subjects
            assert info.config.max_bytes == nats_settings.stream_max_bytes
            assert info.config.max_msg_size == stream.max_msg_size
            assert info.config.duplicate_window == pytest.approx(stream.duplicate_window_s)
        half = nats_settings.stream_max_bytes // 2
        await bus.declare_streams(nc, nats_settings.model_copy(update={"stream_max_bytes": half}))
        assert (await js.stream_info(JOBS.name)).config.max_bytes == half
        await bus.declare_streams(nc, nats_settings)
    finally:
        await nc.close()


async def test_a_server_that_cannot_carry_a_streams_largest_message_is_named_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # nats-server as a deployment might run it: no config file, so its 1 MB default payload
    # limit, below the samples stream's 8 MB.
    settings = make_settings(tmp_path)
    configured = localstack.component(settings, "nats")
    at = configured.argv.index("-c")
    argv = configured.argv[:at] + configured.argv[at + 2 :]
    server = RunningProcess(dataclasses.replace(configured, argv=argv, prepare=None),
                            tmp_path / "logs" / "nats.log")  # fmt: skip
    server.start()
    url = settings.nats.url.replace("nats://", "nats://user:hunter2secret@")
    try:
        nc = await nats.connect(settings.nats.url)
        try:
            assert nc.max_payload == 1024 * 1024
            with caplog.at_level(logging.ERROR, logger="tuneloop.bus"):
                await bus.declare_streams(nc, settings.nats.model_copy(update={"url": url}))
            assert not bus.check_payload_limit(nc, settings.nats)
        finally:
            await nc.close()
    finally:
        server.stop()
    message = next(r.getMessage() for r in caplog.records if r.name == "tuneloop.bus")
    assert f"at most {1024 * 1024} bytes" in message
    assert f"stream {SAMPLES.name} allows ({SAMPLES.max_msg_size})" in message
    assert f"`max_payload: {SAMPLES.max_msg_size}`" in message
    assert "hunter2secret" not in message
    assert f"127.0.0.1:{settings.nats.port}" in message


async def test_published_event_reaches_a_durable_subscriber_as_the_same_class(
    nats_settings: NatsSettings,
) -> None:
    tenant = _tenant()
    received: list[JobQueued] = []
    consumer = await _started(nats_settings, "consumer")
    service = f"svc{uuid.uuid4().hex[:6]}"

    @bus.subscribe(consumer, JobQueued, service=service)
    async def on_queued(event: JobQueued) -> None:
        if event.tenant == tenant:
            received.append(event)

    await consumer.start()
    producer = await _started(nats_settings, "producer")
    try:
        sent = JobQueued(tenant=tenant, job_id="job-1", position=2)
        await bus.publish(producer, sent)
        await eventually(lambda: len(received) == 1)
        assert received == [sent]
        assert isinstance(received[0], JobQueued)
    finally:
        await producer.stop()
        await consumer.stop()


async def test_republishing_the_same_event_is_stored_once(nats_settings: NatsSettings) -> None:
    tenant = _tenant()
    producer = await _started(nats_settings, "producer")
    try:
        event = JobQueued(tenant=tenant, job_id="job-dup", position=0)
        await bus.publish(producer, event)
        await bus.publish(producer, event)  # a retry after a lost ack
        js = producer.connection.jetstream()
        info = await js.stream_info(JOBS.name, subjects_filter=event.subject)
        assert info.state.subjects == {event.subject: 1}
        stored = await js.get_last_msg(JOBS.name, event.subject)
        assert JobQueued.model_validate_json(stored.data) == event
    finally:
        await producer.stop()


async def test_events_published_together_reach_a_faststream_subscriber_once_each(
    nats_settings: NatsSettings,
) -> None:
    tenant = _tenant()
    received: list[JobQueued] = []
    consumer = await _started(nats_settings, "consumer")

    @bus.subscribe(consumer, JobQueued, service=f"svc{uuid.uuid4().hex[:6]}")
    async def on_queued(event: JobQueued) -> None:
        if event.tenant == tenant:
            received.append(event)

    await consumer.start()
    producer = await _started(nats_settings, "producer")
    try:
        sent = [JobQueued(tenant=tenant, job_id=f"job-{n}", position=n) for n in range(20)]
        # The first event again: a retry inside the duplicate window is stored once.
        assert await bus.publish_many(producer, [*sent, sent[0]]) == [None] * 21
        await eventually(lambda: len(received) == 20)
        await asyncio.sleep(0.3)  # room for a duplicate to show up
        assert sorted(received, key=lambda e: e.position) == sent
    finally:
        await producer.stop()
        await consumer.stop()


async def test_a_sample_as_large_as_its_stream_allows_can_be_published(
    nats_settings: NatsSettings,
) -> None:
    # nats-server's own default payload limit is 1 MB; the stack's config raises it to the
    # largest stream message (the samples stream's 8 MB), or such a sample could never go out.
    producer = await _started(nats_settings, "producer")
    try:
        assert producer.connection.max_payload >= SAMPLES.max_msg_size
        sample = Sample.model_validate(
            {
                "tenant": "acme",
                "source": "gateway",
                "created_at": "2026-12-03T12:00:00Z",
                "messages": [
                    {"role": "user", "content": "x" * 3_000_000},
                    {"role": "assistant", "content": "ok"},
                ],
            }
        )
        event = SampleCaptured(tenant="acme", sample=sample)
        assert await bus.publish_many(producer, [event]) == [None]
    finally:
        await producer.stop()


async def test_events_published_together_without_nats_each_report_their_error(
    private_nats: RunningProcess, tmp_path: Path
) -> None:
    settings = make_settings(
        tmp_path,
        nats={
            "port": private_nats.component.ports[0].number,
            "monitor_port": private_nats.component.ports[1].number,
        },
    ).nats
    producer = await _started(settings, "producer")
    events = [JobQueued(tenant=_tenant(), job_id=f"job-{n}", position=n) for n in range(3)]
    private_nats.kill()  # an outage: the client is reconnecting, its publishes go nowhere
    outcomes = await bus.publish_many(producer, events, timeout_s=1.0)
    assert [type(outcome) for outcome in outcomes] == [TimeoutError] * 3
    private_nats.start()
    await eventually(lambda: producer.connection.is_connected, 15)
    await bus.declare_streams(producer.connection, settings)  # a fresh server
    assert await bus.publish_many(producer, events) == [None] * 3
    await producer.stop()
    # A stopped broker: every event fails at once, none raises.
    outcomes = await bus.publish_many(producer, events, timeout_s=1.0)
    assert [type(outcome) for outcome in outcomes] == [bus.BusUnavailable] * 3


async def test_a_failing_handler_gets_the_event_again(nats_settings: NatsSettings) -> None:
    tenant = _tenant()
    attempts: list[str] = []
    consumer = await _started(nats_settings, "consumer")

    @bus.subscribe(consumer, JobQueued, service=f"svc{uuid.uuid4().hex[:6]}")
    async def flaky(event: JobQueued) -> None:
        if event.tenant != tenant:
            return
        attempts.append(event.event_id)
        if len(attempts) == 1:
            raise RuntimeError("database briefly away")

    await consumer.start()
    try:
        event = JobQueued(tenant=tenant, job_id="job-2", position=0)
        await bus.publish(consumer, event)
        await eventually(lambda: len(attempts) >= 2)
        assert attempts[:2] == [event.event_id, event.event_id]
    finally:
        await consumer.stop()


async def test_durable_consumer_catches_up_after_being_away(nats_settings: NatsSettings) -> None:
    tenant = _tenant()
    service = f"svc{uuid.uuid4().hex[:6]}"
    seen: list[int] = []

    async def run_consumer() -> NatsBroker:
        consumer = await _started(nats_settings, "consumer")

        @bus.subscribe(consumer, JobQueued, service=service)
        async def record(event: JobQueued) -> None:
            if event.tenant == tenant:
                seen.append(event.position)

        await consumer.start()
        return consumer

    consumer = await run_consumer()
    producer = await _started(nats_settings, "producer")
    try:
        await bus.publish(producer, JobQueued(tenant=tenant, job_id="j", position=1))
        await eventually(lambda: seen == [1])
        await consumer.stop()
        for position in (2, 3):  # published while the consumer is down
            await bus.publish(producer, JobQueued(tenant=tenant, job_id="j", position=position))
        consumer = await run_consumer()
        await eventually(lambda: len(seen) >= 3)
        assert seen == [1, 2, 3]
    finally:
        await consumer.stop()
        await producer.stop()


async def test_unreachable_nats_fails_with_one_clear_line() -> None:
    settings = NatsSettings(port=free_port(), connect_timeout_s=1.0)
    broker = bus.make_broker(settings, service="lonely")
    with pytest.raises(
        bus.BusUnavailable, match=rf"NATS at nats://127.0.0.1:{settings.port} unreachable after 1s"
    ):
        await bus.connect(broker, settings)

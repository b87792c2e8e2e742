"""The dead-letter stream against a real nats-server: a batch consumer's poison messages are
copied there (whole, or the refused part of a bundle) before the original is terminated, and an
operator lists them and replays them to their original subject."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from faststream.nats import NatsBroker

from shared import bus, deadletters
from shared.events import DEADLETTERS, JOBS, JobQueued
from shared.settings import NatsSettings, Settings
from tests.plugins.infra import RunningProcess, settings_on_private_nats
from tests.plugins.waiting import eventually

FAST = bus.BatchOptions(batch_size=16, fetch_timeout_s=0.2, retry_delay_s=0.05)


class _BundledJob(JobQueued):
    bundled = True


@pytest.fixture
def nats_settings(
    tmp_path: Path, private_nats: RunningProcess, stack_settings: Settings
) -> NatsSettings:
    # A server of the test's own: the session's JOBS stream holds other tests' events, which
    # this test's consumer would also take (and count as pending).
    return settings_on_private_nats(tmp_path, private_nats, stack_settings).nats


async def _started(settings: NatsSettings) -> NatsBroker:
    broker = bus.make_broker(settings, service="deadletters")
    await bus.connect(broker, settings)
    await bus.declare_streams(broker.connection, settings)
    return broker


def test_the_dead_letter_subject_keeps_the_tenant_token() -> None:
    assert (
        deadletters.subject_for("tuneloop.acme.sample.captured.v1")
        == "tuneloop.acme.deadletter.sample.captured.v1"
    )
    assert deadletters.subject_for("elsewhere") == "tuneloop._system.deadletter.elsewhere"


async def test_poison_messages_are_kept_counted_and_replayed(nats_settings: NatsSettings) -> None:
    tenant, other = f"t{uuid.uuid4().hex[:10]}", f"t{uuid.uuid4().hex[:10]}"
    service = f"svc{uuid.uuid4().hex[:6]}"
    broker = await _started(nats_settings)
    js = broker.connection.jetstream()
    refuse = {1, 5}  # positions the consumer cannot take, until it is fixed
    handled: list[int] = []
    told: list[tuple[str, int, str]] = []

    def decode(data: bytes, subject: str) -> JobQueued | None:
        event = JobQueued.model_validate_json(data)
        if event.tenant not in (tenant, other):
            return None
        if event.position in refuse:
            raise bus.PoisonMessage(f"position: {event.position} is not taken here")
        return event

    async def handle(events: list[JobQueued | None]) -> None:
        handled.extend(e.position for e in events if e is not None)

    def on_dead_letter(subject: str, data: bytes, reason: str) -> None:
        told.append((subject, json.loads(data)["position"], reason))

    consumer = bus.consume_batches(
        broker, JobQueued, service=service, decode=decode, handle=handle, options=FAST,
        on_dead_letter=on_dead_letter,
    )  # fmt: skip
    await bus.publish(broker, JobQueued(tenant=tenant, job_id="j", position=1))  # alone
    bundle = [bus.encode(_BundledJob(tenant=tenant, job_id="j", position=p)) for p in (4, 5, 6)]
    assert await bus.publish_many(broker, bundle) == [None] * 3  # one message, one refused event
    await bus.publish(broker, JobQueued(tenant=other, job_id="j", position=5))
    await consumer.start()
    try:
        await eventually(lambda: sorted(handled) == [4, 6] and len(told) == 3)
        mine = await deadletters.list_dead_letters(js, tenant=tenant)
        assert [json.loads(d.data)["position"] for d in mine] == [1, 5]
        whole, part = mine
        assert whole.subject == part.subject == JobQueued.subject_for(tenant)
        assert whole.stream == JOBS.name
        assert whole.sequence > 0
        assert whole.consumer == bus.durable_name(service, JobQueued)
        assert whole.reason == "position: 1 is not taken here"
        assert part.reason == "event 2: position: 5 is not taken here"
        assert bus.BUNDLE_HEADER not in part.headers  # one event: a plain message
        assert whole.tenant == tenant
        assert whole.at
        theirs = await deadletters.list_dead_letters(js, tenant=other)
        assert [json.loads(d.data)["position"] for d in theirs] == [5]
        assert sorted(p for _, p, _ in told) == [1, 5, 5]
        info = await js.consumer_info(JOBS.name, bus.durable_name(service, JobQueued))
        assert (info.num_ack_pending, info.num_pending) == (0, 0)  # terminated or acked

        refuse.clear()  # the consumer is fixed: replay the tenant's dead letters
        replayed = await deadletters.operator_replay(
            nats_settings, [], replay_all=True, tenant=tenant
        )
        assert replayed == [whole.seq, part.seq]
        await eventually(lambda: sorted(handled) == [1, 4, 5, 6])
        assert await deadletters.list_dead_letters(js, tenant=tenant) == []
        assert len(await deadletters.list_dead_letters(js, tenant=other)) == 1
        # By id: the other tenant's, whose original id is still in the duplicate window.
        assert await deadletters.operator_replay(
            nats_settings, [theirs[0].seq], replay_all=False, tenant=None
        ) == [theirs[0].seq]
        await eventually(lambda: sorted(handled) == [1, 4, 5, 5, 6])
        with pytest.raises(deadletters.UnknownDeadLetter, match=f"dead letter {whole.seq}"):
            await deadletters.replay(js, [whole.seq])  # already replayed
    finally:
        await consumer.stop()
        await broker.stop()


async def _dead_letter_of(nats_settings: NatsSettings, tenant: str) -> None:
    broker = await _started(nats_settings)
    js = broker.connection.jetstream()
    try:
        await js.publish(
            deadletters.subject_for(JobQueued.subject_for(tenant)),
            b'{"not": "a job"}',
            stream=DEADLETTERS.name,
            headers={
                deadletters.ORIGINAL_SUBJECT: JobQueued.subject_for(tenant),
                deadletters.REASON: "ValidationError: job_id missing",
                deadletters.CONSUMER: "scheduler__job_queued_v1",
            },
        )
    finally:
        await broker.stop()


def test_the_operator_lists_dead_letters_from_the_command_line(
    nats_settings: NatsSettings,
) -> None:
    tenant = f"t{uuid.uuid4().hex[:10]}"
    asyncio.run(_dead_letter_of(nats_settings, tenant))
    env = os.environ | {"TUNELOOP_NATS_URL": nats_settings.url, "COLUMNS": "250"}
    command = [sys.executable, "-m", "shared.dev.cli", "deadletters"]
    listed = subprocess.run(
        [*command, "list", "--tenant", tenant], env=env, capture_output=True, text=True
    )
    assert listed.returncode == 0, listed.stderr
    assert "ValidationError: job_id missing" in listed.stdout
    assert "scheduler__job_queued_v1" in listed.stdout
    neither = subprocess.run([*command, "replay"], env=env, capture_output=True, text=True)
    assert neither.returncode == 2
    assert "--id" in neither.stderr
    assert "--all" in neither.stderr

"""The persister (sample.captured -> sample store) against real NATS: killed with SIGKILL in the
middle of a backlog and restarted, it stores every sample exactly once."""

from __future__ import annotations

import asyncio
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import pytest

from shared import bus, db, localstack
from shared.chat import Message, Sample
from shared.events import SampleCaptured
from shared.settings import Settings
from tests.plugins.infra import (
    RunningProcess,
    settings_env,
    settings_on_private_nats,
)

# Batches of 256 store a backlog fast: big enough that the kill lands with most of it left.
TOTAL = 5000


def _sample(i: int) -> Sample:
    return Sample(
        tenant="acme",
        source="upload",
        source_ref=f"file-kill:{i}",
        created_at=datetime.now(UTC),
        messages=[
            Message(role="user", content=f"question {i}"),
            Message(role="assistant", content=f"answer {i}"),
        ],
        tags=["kill-test"],
    )


async def _publish_backlog(settings: Settings) -> None:
    broker = bus.make_broker(settings.nats, service="test-producer")
    await bus.connect(broker, settings.nats)
    await bus.declare_streams(broker.connection, settings.nats)
    try:
        for start in range(0, TOTAL, 50):
            events = [_sample(i) for i in range(start, min(start + 50, TOTAL))]
            await asyncio.gather(
                *(
                    bus.publish(broker, SampleCaptured(tenant="acme", event_id=s.id, sample=s))
                    for s in events
                )
            )
        # One event twice: a redelivery or a replayed publish must not make a second row.
        first = _sample(0)
        await bus.publish(broker, SampleCaptured(tenant="acme", sample=first))
    finally:
        await broker.stop()


def _stored(db_path: Path) -> int:
    try:
        with sqlite3.connect(db_path) as connection:
            return int(connection.execute("select count(*) from ingest_samples").fetchone()[0])
    except sqlite3.OperationalError:
        return 0


@pytest.mark.slow
def test_killed_persister_loses_nothing_and_duplicates_nothing(
    private_nats: RunningProcess,
    s3_server: RunningProcess,
    stack_settings: Settings,
    tmp_path: Path,
) -> None:
    settings = settings_on_private_nats(tmp_path / "svc", private_nats, stack_settings)
    db.migrate(settings.database_url)
    db_path = Path(settings.database_url.removeprefix("sqlite:///"))
    asyncio.run(_publish_backlog(settings))

    component = localstack.component(settings, "ingest")
    log = tmp_path / "ingest.log"
    first = RunningProcess(component, log, env=settings_env(settings))
    first.start()
    try:
        assert localstack.wait_until(lambda: _stored(db_path) > 0, 30, interval_s=0.02)
    finally:
        first.kill()
    at_kill = _stored(db_path)
    assert at_kill < TOTAL, (
        "the backlog was gone before the kill; raise TOTAL so the kill lands mid-way"
    )

    second = RunningProcess(component, log, env=settings_env(settings))
    second.start()
    try:
        assert localstack.wait_until(lambda: _stored(db_path) >= TOTAL, 120, interval_s=0.2), (
            _stored(db_path)
        )
        # Give redeliveries a moment to (not) add anything.
        localstack.wait_until(lambda: False, 1.0)
        assert _stored(db_path) == TOTAL
    finally:
        second.stop()

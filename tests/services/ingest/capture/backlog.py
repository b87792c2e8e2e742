"""A backlog of sample.captured events on real NATS, and the sample store's count: what the
persister tests kill a persister in the middle of."""

from __future__ import annotations

import asyncio
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

from shared import bus
from shared.chat import Message, Sample
from shared.events import SampleCaptured
from shared.settings import Settings

# Batches of 256 store a backlog fast: big enough that the kill lands with most of it left.
TOTAL = 5000


def sample(i: int) -> Sample:
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


async def publish_backlog(settings: Settings) -> None:
    broker = bus.make_broker(settings.nats, service="test-producer")
    await bus.connect(broker, settings.nats)
    await bus.declare_streams(broker.connection, settings.nats)
    try:
        for start in range(0, TOTAL, 50):
            events = [sample(i) for i in range(start, min(start + 50, TOTAL))]
            await asyncio.gather(
                *(
                    bus.publish(broker, SampleCaptured(tenant="acme", event_id=s.id, sample=s))
                    for s in events
                )
            )
        # One event twice: a redelivery or a replayed publish must not make a second row.
        first = sample(0)
        await bus.publish(broker, SampleCaptured(tenant="acme", sample=first))
    finally:
        await broker.stop()


def stored_count(db_path: Path) -> int:
    try:
        with sqlite3.connect(db_path) as connection:
            return int(connection.execute("select count(*) from ingest_samples").fetchone()[0])
    except sqlite3.OperationalError:
        return 0

"""The persister's database takes no writes for 60 s while calls keep coming through the gateway
(real NATS, real ingest and persister processes, the official `openai` SDK): once it is back,
every answered call is stored exactly once. With a bounded number of redeliveries (the bus's
old max_deliver of 10, a second apart) the calls of the outage were lost."""

from __future__ import annotations

import asyncio
import re
import sqlite3
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import openai
import pytest

from services.ingest import handlers
from services.ingest.capture.fidelity import Fidelity
from shared import bus, db
from shared.chat import Message, Sample
from shared.dev import localstack
from shared.events import SAMPLES, SampleCaptured
from shared.settings import Settings
from shared.storage import ObjectStore
from tests.fakes.upstream import RunningUpstream, gateway_env
from tests.plugins.infra import RunningProcess, module_process, settings_on_private_nats
from tests.plugins.tenants import tenant_key

OUTAGE_S = 60.0
CALL_EVERY_S = 0.25
# A BEFORE INSERT trigger refuses every row: the writes fail at once, as they do when a
# PostgreSQL server refuses connections. (Moving or chmod-ing the SQLite file stops nothing: the
# persister's pooled connections keep their open file, and tests may run as root.)
OUTAGE_ON = (
    "CREATE TRIGGER outage BEFORE INSERT ON ingest_samples "
    "BEGIN SELECT RAISE(ABORT, 'outage: the database takes no writes'); END"
)


def _stored(db_path: Path) -> Counter[int]:
    """How many rows hold each call's number."""
    with sqlite3.connect(db_path) as connection:
        bodies = connection.execute("select body from ingest_samples").fetchall()
    found: Counter[int] = Counter()
    for (body,) in bodies:
        found.update(int(n) for n in set(re.findall(rb"outage call (\d+)\b", body)))
    return found


def _execute(db_path: Path, sql: str) -> None:
    with sqlite3.connect(db_path) as connection:
        connection.execute(sql)


class _Caller(threading.Thread):
    """Calls the gateway every CALL_EVERY_S until stopped; keeps the numbers it got answers to."""

    def __init__(self, client: openai.OpenAI) -> None:
        super().__init__(daemon=True)
        self.client = client
        self.answered: list[int] = []
        self.failed: list[str] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        n = 0
        while not self.stopping.wait(CALL_EVERY_S):
            n += 1
            try:
                self.client.chat.completions.create(
                    model="gpt-4o-mini",
                    messages=[{"role": "user", "content": f"outage call {n}"}],
                )
            except openai.OpenAIError as exc:
                self.failed.append(f"{n}: {exc}")
            else:
                self.answered.append(n)


@pytest.mark.slow
def test_every_answered_call_is_stored_once_after_a_minute_without_the_database(
    private_nats: RunningProcess,
    s3_server: RunningProcess,
    stack_settings: Settings,
    tmp_path: Path,
) -> None:
    settings = settings_on_private_nats(tmp_path / "svc", private_nats, stack_settings)
    db.migrate(settings.database_url)
    db_path = Path(settings.database_url.removeprefix("sqlite:///"))
    # A short backoff cap: the backlog comes back within seconds of the outage's end.
    fast = {"TUNELOOP_NATS_MAX_RETRY_DELAY_S": "4"}
    with RunningUpstream() as upstream:
        env = gateway_env(settings, upstream, tmp_path) | fast
        env["TUNELOOP_INGEST_PERSISTER"] = "process"  # the gateway leaves storing to it
        gateway = RunningProcess(
            localstack.component(settings, "ingest"), tmp_path / "ingest.log", env=env
        )
        gateway.start()
        persister = module_process(
            "services.ingest.capture.persister", "persisting samples", settings,
            tmp_path / "persister.log", env=fast,
        )  # fmt: skip
        persister.start()
        url = f"http://127.0.0.1:{settings.services.ingest_port}"
        key = tenant_key(url)
        caller = _Caller(openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0))
        try:
            caller.start()
            assert localstack.wait_until(lambda: len(_stored(db_path)) >= 5, 30), persister.log()
            _execute(db_path, OUTAGE_ON)
            outage_began = time.monotonic()
            time.sleep(2.0)  # what was in hand when the outage began is stored or refused
            stored_early = len(_stored(db_path))
            time.sleep(OUTAGE_S - (time.monotonic() - outage_began))
            # The outage was real: nothing reached the table while it lasted.
            assert len(_stored(db_path)) == stored_early
            answered_during = len(caller.answered)
            _execute(db_path, "DROP TRIGGER outage")
            time.sleep(3.0)  # calls after the outage, too
            caller.stopping.set()
            caller.join(15)
            answered = caller.answered
            assert not caller.failed, caller.failed[:5]
            assert answered_during > stored_early + 100  # many calls waited out the outage
            assert localstack.wait_until(lambda: len(_stored(db_path)) >= len(answered), 60), (
                f"{len(_stored(db_path))} of {len(answered)} stored; persister log:\n"
                f"{persister.log()[-3000:]}"
            )
            stored = _stored(db_path)
            assert sorted(stored) == sorted(answered)
            assert set(stored.values()) == {1}  # exactly once each
            log = persister.log()
            assert "outage: the database takes no writes" in log
            assert "dead-lettered" not in log  # a fault of the moment is never given up on
        finally:
            caller.stopping.set()
            persister.stop()
            gateway.stop()


async def test_a_redelivered_batch_stores_nothing_twice(
    private_nats: RunningProcess, stack_settings: Settings, tmp_path: Path
) -> None:
    """Every message of the stream delivered again (a new durable of the same name reads from
    the start, as after a commit whose ack was lost): the rows stay as they were."""
    settings = settings_on_private_nats(tmp_path / "svc", private_nats, stack_settings)
    db.migrate(settings.database_url)
    db_path = Path(settings.database_url.removeprefix("sqlite:///"))
    engine = db.make_engine(settings.database_url)
    broker = bus.make_broker(settings.nats, service="test")
    await bus.connect(broker, settings.nats)
    await bus.declare_streams(broker.connection, settings.nats)
    samples = [_sample(i) for i in range(20)]
    events = [SampleCaptured(tenant="acme", sample=s) for s in samples]
    assert await bus.publish_many(broker, events) == [None] * 20
    durable = bus.durable_name(handlers.SERVICE, SampleCaptured)

    async def persist_all() -> list[tuple[str, str]]:
        persister = handlers.sample_persister(
            broker=broker,
            engine=engine,
            store=ObjectStore.from_settings(settings.s3),  # unused: no sample by reference
            fidelity=Fidelity(),
        )
        await persister.start()
        try:
            async with asyncio.timeout(20):
                while sum(_stored(db_path).values()) < 20:
                    await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)  # room for a second copy to be written
        finally:
            await persister.stop()
        with sqlite3.connect(db_path) as connection:
            return connection.execute("select id, ingested_at, body from ingest_samples").fetchall()

    try:
        first = await persist_all()
        await broker.connection.jetstream().delete_consumer(SAMPLES.name, durable)
        again = await persist_all()
        assert sorted(first) == sorted(again)
        assert len(again) == 20
    finally:
        await broker.stop()
        engine.dispose()


def _sample(i: int) -> Sample:
    return Sample(
        tenant="acme",
        source="upload",
        created_at=datetime.now(UTC),
        messages=[
            Message(role="user", content=f"outage call {i}"),
            Message(role="assistant", content=f"answer {i}"),
        ],
    )

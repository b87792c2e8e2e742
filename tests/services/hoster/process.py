"""The hoster as a process for tests (on the session's real NATS and S3, its own SQLite): a
tenant and key, the tiny base installed, the process started and, on the way out, stopped with
the engines it left and its log checked for errors; and the bus helpers those tests share."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from faststream.nats import NatsBroker
from sqlmodel import Session

from services.hoster.engines import stop_leftovers
from shared import auth, bus, db
from shared.dev import localstack
from shared.events import EvalDecided, Event
from shared.settings import Settings
from shared.storage import ObjectStore
from tests.plugins.infra import RunningProcess, make_settings, settings_env
from tests.services.hoster.checkpoints import BASE_ID, install_base

SERVICE_TOKEN = {"Authorization": "Bearer tuneloop-dev-service"}


@dataclass
class Tenant:
    """What a test stack prepared before its processes start."""

    settings: Settings
    tenant: str
    key: str
    store: ObjectStore


def prepare(tmp: Path, stack_settings: Settings, tiny_model_dir: Path) -> Tenant:
    """Settings under tmp, the database migrated, a tenant and its key, the tiny base installed
    as the catalogue's, the bucket made."""
    settings = make_settings(tmp, infra=stack_settings)
    db.migrate(settings.database_url)
    tenant = f"t{uuid.uuid4().hex[:10]}"
    with Session(db.make_engine(settings.database_url)) as session:
        auth.create_tenant(session, tenant_id=tenant, name=tenant)
        _, key = auth.issue_api_key(session, tenant_id=tenant, name="tests")
    install_base(settings.app.data_dir, tiny_model_dir)
    store = ObjectStore.from_settings(settings.s3)
    store.ensure_bucket()
    return Tenant(settings, tenant, key, store)


@dataclass
class Hoster:
    url: str
    key: str
    tenant: str
    settings: Settings
    store: ObjectStore
    work: Path
    process: RunningProcess

    def get(self, path: str) -> httpx.Response:
        return httpx.get(f"{self.url}{path}", headers={"Authorization": f"Bearer {self.key}"})

    def send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.key}"} | kwargs.pop("headers", {})
        return httpx.request(method, f"{self.url}{path}", headers=headers, timeout=30, **kwargs)


@contextlib.contextmanager
def hoster_process(
    tmp: Path, stack_settings: Settings, tiny_model_dir: Path, env: dict[str, str]
) -> Iterator[Hoster]:
    prepared = prepare(tmp, stack_settings, tiny_model_dir)
    settings = prepared.settings
    process = RunningProcess(
        localstack.component(settings, "hoster"),
        tmp / "logs" / "hoster.log",
        env=settings_env(settings) | env,
    )
    process.start()
    try:
        url = f"http://127.0.0.1:{settings.services.hoster_port}"
        yield Hoster(url, prepared.key, prepared.tenant, settings, prepared.store, tmp, process)
    finally:
        process.stop()
        stop_leftovers(tmp / "hoster" / "deployments")  # deployments outlive the hoster
        # Ours, not FastStream's supervisor (which logs a pull fetch that timed out on a busy CPU).
        errors = [
            line
            for line in process.log().splitlines()
            if '"level":"ERROR"' in line and '"logger":"tuneloop.hoster.faststream"' not in line
        ]
        assert not errors, errors


@contextlib.asynccontextmanager
async def event_broker(settings: Settings, service: str) -> AsyncIterator[NatsBroker]:
    """A broker on the test's NATS with every stream declared, to publish and read events."""
    broker = bus.make_broker(settings.nats, service=service)
    await bus.connect(broker, settings.nats)
    await bus.declare_streams(broker.connection, settings.nats)
    try:
        yield broker
    finally:
        await broker.stop()


async def next_event(
    broker: NatsBroker,
    cls: type[Event],
    tenant: str,
    stream: str,
    timeout_s: float,
    skip: Callable[[dict[str, Any]], bool] = lambda event: False,
) -> dict[str, Any]:
    """The tenant's first `cls` event in the stream that `skip` does not pass over."""
    js = broker.connection.jetstream()
    sub = await js.pull_subscribe(cls.subject_for(tenant), stream=stream)
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                with contextlib.suppress(TimeoutError):
                    for message in await sub.fetch(1, timeout=5):
                        event = cls.model_validate_json(message.data).model_dump()
                        if not skip(event):
                            return event
    finally:
        await sub.unsubscribe()


def decision(tenant: str, job_id: str, uri: str, **overrides: Any) -> EvalDecided:
    values: dict[str, Any] = {
        "tenant": tenant,
        "job_id": job_id,
        "base_model": BASE_ID,
        "fine_tuned_model": f"ft:{BASE_ID}:tickets:{job_id}",
        "dataset_id": "ds-tickets",
        "dataset_version": "abc123",
        "best_step": 10,
        "best_checkpoint_uri": uri,
        "best_score": 0.92,
        "base_score": 0.41,
        "scores": {5: 0.8, 10: 0.92},
        "gate": "passed",
        "gate_reason": "0.92 >= 0.80 and beats the base by 0.51",
        "auto_deploy": True,
    }
    return EvalDecided.model_validate(values | overrides)

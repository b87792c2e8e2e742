"""The evaluator's handlers on a broker of their own, in front of the fake hoster (fakes.py), on
real NATS, S3 and SQLite: the `loop` fixture the flow tests share, a job's plan, the read API."""

from __future__ import annotations

import asyncio
import json
import shutil
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from faststream.nats import NatsBroker
from sqlalchemy.engine import Engine

from services.evaluator import api, handlers
from services.evaluator.engine_client import HosterClient
from services.evaluator.runner import Evaluator
from shared import auth, bus
from shared.db import make_engine, session_scope
from shared.events import Event, JobPlanned
from shared.settings import Settings
from shared.storage import ObjectStore
from tests.plugins.infra import RunningProcess
from tests.services.evaluator.fakes import SERVICE_TOKEN, FakeHoster, RunningHoster


@dataclass
class Loop:
    """The evaluator's handlers on a broker of their own, and every eval.* event they publish."""

    broker: NatsBroker
    db: Engine
    store: ObjectStore
    hoster: FakeHoster
    tenant: str
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    async def publish(self, event: Event) -> None:
        await bus.publish(self.broker, event)

    def of(self, name: str, job_id: str) -> list[dict[str, Any]]:
        return [e for s, e in self.events if f".eval.{name}." in s and e["job_id"] == job_id]

    async def wait_for(self, check: Callable[[], bool], timeout_s: float = 60.0) -> None:
        async with asyncio.timeout(timeout_s):
            while not check():
                await asyncio.sleep(0.05)


@pytest.fixture(scope="module")
async def loop(
    nats_server: RunningProcess,
    s3_server: RunningProcess,
    stack_settings: Settings,
    sqlite_template: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Loop]:
    tmp = tmp_path_factory.mktemp("evaluator")
    shutil.copyfile(sqlite_template, tmp / "tuneloop.db")
    db = make_engine(f"sqlite:///{tmp / 'tuneloop.db'}")
    store = ObjectStore.from_settings(stack_settings.s3, bucket=f"t-{uuid.uuid4().hex[:16]}")
    store.ensure_bucket()
    fake = FakeHoster(skill={"base": 0.25, "ckpt-10": 0.5, "ckpt-20": 1.0, "ckpt-30": 1.0})
    with RunningHoster(fake):
        client = HosterClient(fake.url, SERVICE_TOKEN)
        broker = bus.make_broker(stack_settings.nats, service="evaluator-test")
        state = Loop(broker, db, store, fake, tenant=f"t{uuid.uuid4().hex[:10]}")
        evaluator = Evaluator(db=db, store=store, hoster=client, publish=state.publish)
        broker.include_router(
            handlers.build_router(evaluator, service=f"ev{uuid.uuid4().hex[:8]}", keepalive_s=1)
        )
        await bus.connect(broker, stack_settings.nats)
        await bus.declare_streams(broker.connection, stack_settings.nats)

        async def seen(msg: Any) -> None:
            state.events.append((msg.subject, json.loads(msg.data)))

        subscription = await broker.connection.subscribe(f"tuneloop.{state.tenant}.eval.>", cb=seen)
        await broker.start()
        try:
            yield state
        finally:
            await subscription.unsubscribe()
            await broker.stop()
            await client.aclose()
            store.remove_bucket()
            db.dispose()


def job_plan(loop: Loop, job_id: str, dataset_uri: str, *, eval_every: int) -> JobPlanned:
    return JobPlanned(
        tenant=loop.tenant,
        job_id=job_id,
        base_model="SmolLM2-135M-Instruct",
        dataset_id="ds-1",
        dataset_version="v1",
        dataset_uri=dataset_uri,
        task_kind="json",
        steps=30,
        eval_every=eval_every,
        eval_items=16,
        fine_tuned_model=f"ft:SmolLM2-135M-Instruct:demo:{job_id}",
        auto_deploy=True,
    )


def read_api(loop: Loop) -> tuple[TestClient, str, str]:
    """The read API on the loop's database, a key of the loop's tenant and one of another."""
    keys = []
    with session_scope(loop.db) as session:
        for tenant in (loop.tenant, f"o{uuid.uuid4().hex[:10]}"):
            auth.ensure_tenant(session, tenant_id=tenant)
            keys.append(auth.issue_api_key(session, tenant_id=tenant, name="tests")[1])
    app = FastAPI()
    app.state.db_engine = loop.db
    app.include_router(api.router)
    app.add_exception_handler(api.EvalError, api.eval_error_response)
    return TestClient(app), keys[0], keys[1]

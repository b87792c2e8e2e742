"""Cold and hot through the gateway, on real processes (ingest, hoster, NATS, S3, SQLite; real
`LoraEngine`s of the tiny random Llama): a deployment no call reaches goes cold, and the next
call through the gateway (official openai SDK) waits while the gateway wakes it (the hoster's
internal route), then is answered; concurrent calls share the wake; a served name naming it
wakes it the same way."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from faststream.nats import NatsBroker
from sqlmodel import Session

from services.hoster.engines import stop_leftovers
from shared import auth, bus, db, localstack
from shared.events import DEPLOYMENTS, MODELS, DeploymentCold, EvalDecided, Event, ModelRegistered
from shared.settings import Settings
from shared.storage import ObjectStore
from tests.plugins.infra import RunningProcess, make_settings, settings_env
from tests.services.hoster.checkpoints import BASE_ID, install_base, store_checkpoint

pytestmark = pytest.mark.slow
HI: Any = [{"role": "user", "content": "Hi"}]


@dataclass
class Stack:
    url: str  # the gateway's
    key: str
    tenant: str
    settings: Settings
    store: ObjectStore
    work: Path

    def send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.key}"}
        return httpx.request(method, f"{self.url}{path}", headers=headers, timeout=60, **kwargs)


@pytest.fixture(scope="module")
def stack(
    nats_server: RunningProcess,
    s3_server: RunningProcess,
    stack_settings: Settings,
    tmp_path_factory: pytest.TempPathFactory,
    tiny_model_dir: Path,
) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("cold")
    settings = make_settings(tmp, infra=stack_settings)
    db.migrate(settings.database_url)
    tenant = f"t{uuid.uuid4().hex[:10]}"
    with Session(db.make_engine(settings.database_url)) as session:
        auth.create_tenant(session, tenant_id=tenant, name=tenant)
        _, key = auth.issue_api_key(session, tenant_id=tenant, name="tests")
    install_base(settings.app.data_dir, tiny_model_dir)
    store = ObjectStore.from_settings(settings.s3)
    store.ensure_bucket()
    env = settings_env(settings) | {
        "TUNELOOP_HOSTER_ENGINE_LOAD_TIMEOUT_S": "240",
        "TUNELOOP_HOSTER_WATCH_INTERVAL_S": "0.5",
        "TUNELOOP_HOSTER_IDLE_UNLOAD_S": "3",
    }
    processes = []
    try:
        for name in ("hoster", "ingest"):
            process = RunningProcess(
                localstack.component(settings, name), tmp / f"{name}.log", env=env
            )
            process.start(timeout_s=90)
            processes.append(process)
        url = f"http://127.0.0.1:{settings.services.ingest_port}"
        yield Stack(url, key, tenant, settings, store, tmp)
    finally:
        for process in reversed(processes):
            process.stop()
        stop_leftovers(tmp / "hoster" / "deployments")


@pytest.fixture
async def broker(stack: Stack) -> AsyncIterator[NatsBroker]:
    broker = bus.make_broker(stack.settings.nats, service="cold-tests")
    await bus.connect(broker, stack.settings.nats)
    await bus.declare_streams(broker.connection, stack.settings.nats)
    yield broker
    await broker.stop()


async def first_event(broker: NatsBroker, cls: type[Event], tenant: str, stream: str,
                      timeout_s: float, deployment_id: str) -> dict[str, Any]:  # fmt: skip
    js = broker.connection.jetstream()
    sub = await js.pull_subscribe(cls.subject_for(tenant), stream=stream)
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                try:
                    for message in await sub.fetch(1, timeout=2):
                        event = cls.model_validate_json(message.data).model_dump()
                        if event.get("deployment_id", deployment_id) == deployment_id:
                            return event
                except TimeoutError:
                    continue
    finally:
        await sub.unsubscribe()


async def registered(stack: Stack, broker: NatsBroker, job: str) -> str:
    uri = store_checkpoint(stack.store, stack.work, tenant=stack.tenant, job_id=job, step=10)
    name = f"ft:{BASE_ID}:cold:{job}"
    decided = EvalDecided(
        tenant=stack.tenant, job_id=job, base_model=BASE_ID, fine_tuned_model=name,
        dataset_id="ds", dataset_version="v1", best_step=10, best_checkpoint_uri=uri,
        best_score=0.9, base_score=0.1, scores={10: 0.9}, gate="passed", gate_reason="passed",
    )  # fmt: skip
    await bus.publish(broker, decided)
    await first_event(broker, ModelRegistered, stack.tenant, MODELS.name, 60, "")
    return name


def status(stack: Stack, deployment_id: str) -> str:
    return str(stack.send("GET", f"/v1/deployments/{deployment_id}").json()["status"])


async def test_a_call_to_a_cold_deployment_waits_for_it_to_wake_and_is_answered(
    stack: Stack, broker: NatsBroker
) -> None:
    name = await registered(stack, broker, "ftjob-cold-gateway")
    body = {"model": name, "served_name": "sleepy"}
    created = stack.send("POST", "/v1/deployments", json=body)  # relayed to the hoster
    assert created.status_code == 200, created.text
    deployment_id = created.json()["id"]
    assert localstack.wait_until(lambda: status(stack, deployment_id) == "ready", 240)
    client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=stack.key, max_retries=0)

    def ask(model: str) -> str:
        reply = client.chat.completions.create(model=model, messages=HI, max_tokens=5)
        return reply.choices[0].message.content or ""

    assert localstack.wait_until(lambda: bool(ask("sleepy")), 30, interval_s=0.2)  # routed
    warm = ask(name)
    await first_event(broker, DeploymentCold, stack.tenant, DEPLOYMENTS.name, 60, deployment_id)
    assert status(stack, deployment_id) == "cold"
    await asyncio.sleep(0.5)  # the gateway has heard it too

    with ThreadPoolExecutor(4) as pool:  # four calls wait on one wake, none fails
        answers = list(pool.map(lambda _: ask(name), range(4)))
    assert answers == [warm] * 4
    assert status(stack, deployment_id) == "ready"

    # Cold again (the stream's first cold event is the one above: the status says it).
    assert localstack.wait_until(lambda: status(stack, deployment_id) == "cold", 60)
    await asyncio.sleep(0.5)
    assert ask("sleepy") == warm  # through the served name, woken the same way
    stack.send("DELETE", f"/v1/deployments/{deployment_id}")

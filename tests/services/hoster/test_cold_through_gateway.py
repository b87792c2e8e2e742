"""Cold and hot through the gateway, on real processes (ingest, hoster, NATS, S3, SQLite; real
`LoraEngine`s of the tiny random Llama): a deployment no call reaches goes cold, and the next
call through the gateway (official openai SDK) waits while the gateway wakes it (the hoster's
internal route), then is answered; concurrent calls share the wake; a served name naming it
wakes it the same way."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from faststream.nats import NatsBroker

from services.hoster.engines import stop_leftovers
from shared import bus
from shared.dev import localstack
from shared.events import DEPLOYMENTS, MODELS, DeploymentCold, ModelRegistered
from shared.settings import Settings
from shared.storage import ObjectStore
from tests.plugins.infra import RunningProcess, settings_env
from tests.services.hoster.checkpoints import BASE_ID, store_checkpoint
from tests.services.hoster.process import decision, event_broker, next_event, prepare

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
    prepared = prepare(tmp, stack_settings, tiny_model_dir)
    settings = prepared.settings
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
        yield Stack(url, prepared.key, prepared.tenant, settings, prepared.store, tmp)
    finally:
        for process in reversed(processes):
            process.stop()
        stop_leftovers(tmp / "hoster" / "deployments")


@pytest.fixture
async def broker(stack: Stack) -> AsyncIterator[NatsBroker]:
    async with event_broker(stack.settings, "cold-tests") as broker:
        yield broker


def of(deployment_id: str) -> Callable[[dict[str, Any]], bool]:
    return lambda event: event["deployment_id"] != deployment_id


async def registered(stack: Stack, broker: NatsBroker, job: str) -> str:
    uri = store_checkpoint(stack.store, stack.work, tenant=stack.tenant, job_id=job, step=10)
    name = f"ft:{BASE_ID}:cold:{job}"
    decided = decision(stack.tenant, job, uri, fine_tuned_model=name, auto_deploy=False)
    await bus.publish(broker, decided)
    await next_event(broker, ModelRegistered, stack.tenant, MODELS.name, 60,
                     skip=lambda e: e["model_id"] != name)  # fmt: skip
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
    await next_event(
        broker, DeploymentCold, stack.tenant, DEPLOYMENTS.name, 60, skip=of(deployment_id)
    )
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

"""The hoster as a process on real NATS, S3 and SQLite, its engines real `LoraEngine`s of the tiny
random Llama: two versions of one base deployed at once share one engine process and answer
differently through the official openai SDK; each was warmed up with one request naming it
before `deployment.ready`; undeploying one leaves the other answering and the last one out stops
the engine. A version no call reaches for TUNELOOP_HOSTER_IDLE_UNLOAD_S goes cold (its adapter
unloaded; its engine stopped once nothing is left on it) unless pinned, and a wake (concurrent
ones sharing it) loads it again, warmed up, before it answers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from faststream.nats import NatsBroker
from sqlmodel import Session

from services.hoster.models import Deployment
from shared import bus, db
from shared.events import (
    DEPLOYMENTS,
    MODELS,
    DeploymentCold,
    DeploymentReady,
    DeploymentStopped,
    ModelRegistered,
)
from shared.processes import pid_alive
from shared.settings import Settings
from tests.plugins.infra import RunningProcess
from tests.services.hoster.checkpoints import BASE_ID, store_checkpoint
from tests.services.hoster.process import (
    SERVICE_TOKEN,
    Hoster,
    decision,
    event_broker,
    hoster_process,
    next_event,
)

pytestmark = pytest.mark.slow
IDLE_UNLOAD_S = 4
HI: Any = [{"role": "user", "content": "Hi"}]  # seeds 1 and 2 answer it differently


@pytest.fixture(scope="module")
def hoster(
    nats_server: RunningProcess,
    s3_server: RunningProcess,
    stack_settings: Settings,
    tmp_path_factory: pytest.TempPathFactory,
    tiny_model_dir: Path,
) -> Iterator[Hoster]:
    env = {
        "TUNELOOP_HOSTER_ENGINE_LOAD_TIMEOUT_S": "240",
        "TUNELOOP_HOSTER_WATCH_INTERVAL_S": "0.5",
        "TUNELOOP_HOSTER_IDLE_UNLOAD_S": str(IDLE_UNLOAD_S),
    }
    tmp = tmp_path_factory.mktemp("hoster-shared")
    with hoster_process(tmp, stack_settings, tiny_model_dir, env) as hoster:
        yield hoster


@pytest.fixture
async def broker(hoster: Hoster) -> AsyncIterator[NatsBroker]:
    async with event_broker(hoster.settings, "hoster-tests") as broker:
        yield broker


async def register(hoster: Hoster, broker: NatsBroker, job: str, seed: int) -> str:
    uri = store_checkpoint(
        hoster.store, hoster.work, tenant=hoster.tenant, job_id=job, step=10, seed=seed
    )
    event = decision(
        hoster.tenant, job, uri, auto_deploy=False, fine_tuned_model=f"ft:{BASE_ID}:s:{job}"
    )
    await bus.publish(broker, event)
    name = event.fine_tuned_model
    await next_event(broker, ModelRegistered, hoster.tenant, MODELS.name, 60,
                     skip=lambda e: e["model_id"] != name)  # fmt: skip
    return name


async def deploy(hoster: Hoster, broker: NatsBroker, name: str, *, pinned: bool) -> dict[str, Any]:
    """The deployment's `deployment.ready`."""
    created = hoster.send("POST", "/v1/deployments", json={"model": name, "pinned": pinned})
    assert created.status_code == 200, created.text
    assert (created.json()["status"], created.json()["pinned"]) == ("pending", pinned)
    ready = await next_event(broker, DeploymentReady, hoster.tenant, DEPLOYMENTS.name, 300,
                             skip=lambda e: e["deployment_id"] != created.json()["id"])  # fmt: skip
    return ready


def stats(endpoint_url: str) -> dict[str, Any]:
    """The engine's calls per name (the hoster's warm-up included)."""
    models: dict[str, Any] = httpx.get(f"{endpoint_url.removesuffix('/v1')}/stats").json()["models"]
    return models


def row(hoster: Hoster, deployment_id: str) -> Deployment:
    with Session(db.make_engine(hoster.settings.database_url)) as session:
        found = session.get(Deployment, deployment_id)
        assert found is not None
        return found


def answer(client: openai.OpenAI, model: str) -> str:
    reply = client.chat.completions.create(model=model, messages=HI, max_tokens=8, temperature=0)
    return reply.choices[0].message.content or ""


async def test_two_versions_of_a_base_share_one_engine_and_answer_differently(
    hoster: Hoster, broker: NatsBroker
) -> None:
    a = await register(hoster, broker, "ftjob-share-a", seed=1)
    b = await register(hoster, broker, "ftjob-share-b", seed=2)
    # How much sooner the second is ready is measured by tests/benchmarks/bench_deploy.py.
    first = await deploy(hoster, broker, a, pinned=True)
    second = await deploy(hoster, broker, b, pinned=True)

    assert second["endpoint_url"] == first["endpoint_url"]
    rows = [row(hoster, first["deployment_id"]), row(hoster, second["deployment_id"])]
    assert rows[0].pid == rows[1].pid
    assert rows[0].engine_id == rows[1].engine_id
    assert rows[0].pid is not None
    # Each was warmed up by name before it was ready: the one call each has had is the hoster's.
    calls = stats(first["endpoint_url"])
    assert {name: s["requests"] for name, s in calls.items()} == {a: 1, b: 1}

    client = openai.OpenAI(base_url=first["endpoint_url"], api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list().data] == [a, b]  # not the base
    with pytest.raises(openai.NotFoundError):
        answer(client, BASE_ID)
    said_a, said_b = answer(client, a), answer(client, b)
    assert said_a != said_b, said_a

    gone = hoster.send("DELETE", f"/v1/deployments/{first['deployment_id']}")
    assert gone.json()["status"] == "stopped"
    await next_event(broker, DeploymentStopped, hoster.tenant, DEPLOYMENTS.name, 30,
                     skip=lambda e: e["deployment_id"] != first["deployment_id"])  # fmt: skip
    assert answer(client, b) == said_b  # the same engine, the other adapter still on it
    with pytest.raises(openai.NotFoundError):
        answer(client, a)
    assert [m.id for m in client.models.list().data] == [b]

    hoster.send("DELETE", f"/v1/deployments/{second['deployment_id']}")
    assert rows[0].pid is not None
    assert not pid_alive(rows[0].pid)  # the last one out stopped it
    with pytest.raises(openai.APIConnectionError):
        client.models.list()


async def test_an_idle_version_goes_cold_and_a_wake_loads_it_again_warmed_up(
    hoster: Hoster, broker: NatsBroker
) -> None:
    kept = await register(hoster, broker, "ftjob-cold-kept", seed=1)
    idle = await register(hoster, broker, "ftjob-cold-idle", seed=2)
    pinned = await deploy(hoster, broker, kept, pinned=True)
    unpinned = await deploy(hoster, broker, idle, pinned=False)
    idle_id, kept_id = unpinned["deployment_id"], pinned["deployment_id"]
    engine_pid = row(hoster, kept_id).pid

    cold = await next_event(broker, DeploymentCold, hoster.tenant, DEPLOYMENTS.name, 60,
                            skip=lambda e: e["deployment_id"] != idle_id)  # fmt: skip
    assert (cold["served_model_name"], cold["idle_s"]) == (idle, IDLE_UNLOAD_S)
    assert hoster.get(f"/v1/deployments/{idle_id}").json()["status"] == "cold"
    assert hoster.get(f"/v1/deployments/{kept_id}").json()["status"] == "ready"  # pinned
    assert set(stats(pinned["endpoint_url"])) == {kept}  # the adapter is off the engine

    # The gateway's wake: several calls at once share one launch, each answered once it is ready.
    path = f"/internal/deployments/{idle_id}/wake"
    with ThreadPoolExecutor(3) as pool:
        woken = list(pool.map(lambda _: hoster.send("POST", path, headers=SERVICE_TOKEN), range(3)))
    assert [w.status_code for w in woken] == [200, 200, 200], woken[0].text
    assert {w.json()["status"] for w in woken} == {"ready"}
    assert woken[0].json()["endpoint_url"] == pinned["endpoint_url"]  # onto the shared engine
    assert row(hoster, idle_id).pid == engine_pid
    assert stats(pinned["endpoint_url"])[idle]["requests"] == 1  # warmed up once, before ready
    client = openai.OpenAI(base_url=pinned["endpoint_url"], api_key="unused", max_retries=0)
    assert answer(client, idle)

    # Unpinned, both go cold and the engine stops; a wake starts a fresh one.
    again = hoster.send("POST", "/v1/deployments", json={"model": kept, "pinned": False})
    assert (again.json()["id"], again.json()["pinned"]) == (kept_id, False)
    for deployment_id in (kept_id, idle_id):
        await next_event(broker, DeploymentCold, hoster.tenant, DEPLOYMENTS.name, 60,
                         skip=lambda e, d=deployment_id: e["deployment_id"] != d)  # fmt: skip
    assert engine_pid is not None
    for _ in range(50):
        if not pid_alive(engine_pid):
            break
        await asyncio.sleep(0.1)
    assert not pid_alive(engine_pid)
    assert hoster.send("POST", "/internal/deployments/dep-nope/wake",
                       headers=SERVICE_TOKEN).status_code == 404  # fmt: skip
    assert hoster.send("POST", path).status_code == 401  # a tenant key cannot wake
    woken_again = hoster.send("POST", path, headers=SERVICE_TOKEN).json()
    assert woken_again["status"] == "ready"
    fresh = woken_again["endpoint_url"]
    assert row(hoster, idle_id).pid not in (None, engine_pid)
    ready = await next_event(broker, DeploymentReady, hoster.tenant, DEPLOYMENTS.name, 30,
                             skip=lambda e: e["deployment_id"] != idle_id
                             or e["endpoint_url"] != fresh)  # fmt: skip
    assert ready["served_model_name"] == idle
    calls = stats(fresh)
    assert set(calls) == {idle}  # a fresh engine of its own now
    assert calls[idle]["requests"] == 1
    client = openai.OpenAI(base_url=fresh, api_key="unused", max_retries=0)
    assert answer(client, idle)
    for deployment_id in (kept_id, idle_id):
        hoster.send("DELETE", f"/v1/deployments/{deployment_id}")

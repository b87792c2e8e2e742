"""The hoster as a process on real NATS, S3 and SQLite: an eval decision registers a version
(once), auto-deploys it on a real `transformers serve` engine that answers the ft: name through
the official openai SDK (plain and streamed), the registry lists it with its parent, a rejected
version cannot be deployed (409 with its numbers), and DELETE stops the engine."""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from faststream.nats import NatsBroker
from sqlmodel import Session

from services.hoster.models import Deployment
from shared import bus, db
from shared.events import (
    DEPLOYMENTS,
    MODELS,
    DeploymentReady,
    DeploymentRolledBack,
    DeploymentStopped,
    ModelRegistered,
    ServedNameChanged,
)
from shared.settings import Settings
from shared.storage import COMMIT_MARKER
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
    }
    tmp = tmp_path_factory.mktemp("hoster")
    with hoster_process(tmp, stack_settings, tiny_model_dir, env) as hoster:
        yield hoster


@pytest.fixture
async def broker(hoster: Hoster) -> AsyncIterator[NatsBroker]:
    async with event_broker(hoster.settings, "hoster-tests") as broker:
        yield broker


async def test_a_decision_is_registered_deployed_and_answers_the_ft_name(
    hoster: Hoster, broker: NatsBroker
) -> None:
    job = "ftjob-served"
    uri = store_checkpoint(hoster.store, hoster.work, tenant=hoster.tenant, job_id=job, step=10)
    event = decision(hoster.tenant, job, uri)
    await bus.publish(broker, event)
    await bus.publish(broker, event.model_copy(update={"event_id": uuid.uuid4().hex}))  # redelivery
    registered = await next_event(broker, ModelRegistered, hoster.tenant, MODELS.name, 60)
    name = event.fine_tuned_model
    assert (registered["model_id"], registered["step"], registered["gate"]) == (name, 10, "passed")
    marker = hoster.store.get_bytes(f"{uri}/{COMMIT_MARKER}").decode()
    assert registered["sha256"] == marker  # the digest of the manifest of every file's sha256

    ready = await next_event(broker, DeploymentReady, hoster.tenant, DEPLOYMENTS.name, 300)
    assert ready["served_model_name"] == name
    assert ready["version_id"] == registered["version_id"]

    models = hoster.get("/v1/models").json()
    assert models["object"] == "list"
    assert [(m["id"], m["parent"]) for m in models["data"]] == [(BASE_ID, None), (name, BASE_ID)]
    assert hoster.get(f"/v1/models/{name}").json()["version_id"] == registered["version_id"]
    missing = hoster.get("/v1/models/ft:nope:x:y")
    assert missing.status_code == 404
    assert "ft:nope:x:y" in missing.json()["detail"]

    client = openai.OpenAI(base_url=ready["endpoint_url"], api_key="unused", max_retries=0)
    messages: Any = [{"role": "user", "content": "Extract the ticket fields."}]
    answer = client.chat.completions.create(model=name, messages=messages, max_tokens=5)
    assert answer.choices[0].finish_reason is not None
    chunks = [
        c
        for c in client.chat.completions.create(
            model=name, messages=messages, max_tokens=5, stream=True
        )
        if c.choices
    ]
    assert chunks[-1].choices[0].finish_reason is not None
    listed = client.models.list()
    assert [m.id for m in listed.data] == [name]

    deployments = hoster.get("/v1/deployments").json()["data"]
    assert [(d["model"], d["status"]) for d in deployments] == [(name, "ready")]
    again = hoster.send("POST", "/v1/deployments", json={"model": registered["version_id"]})
    assert again.json()["id"] == deployments[0]["id"]  # an active deployment is reused

    stopped = hoster.send("DELETE", f"/v1/deployments/{deployments[0]['id']}")
    assert stopped.json()["status"] == "stopped"
    gone = await next_event(broker, DeploymentStopped, hoster.tenant, DEPLOYMENTS.name, 30)
    assert gone["served_model_name"] == name
    with pytest.raises(openai.APIConnectionError):
        client.models.list()


async def test_a_rejected_version_is_registered_but_not_deployable(
    hoster: Hoster, broker: NatsBroker
) -> None:
    job = "ftjob-rejected"
    uri = store_checkpoint(hoster.store, hoster.work, tenant=hoster.tenant, job_id=job, step=10)
    event = decision(
        hoster.tenant, job, uri, gate="rejected", best_score=0.3, gate_reason="0.30 < 0.80"
    )
    await bus.publish(broker, event)
    name = event.fine_tuned_model
    for _ in range(200):
        if hoster.get(f"/v1/models/{name}").status_code == 200:
            break
        await asyncio.sleep(0.1)
    refused = hoster.send("POST", "/v1/deployments", json={"model": name})
    assert refused.status_code == 409
    error = refused.json()["error"]
    assert (error["task_score"], error["base_score"], error["gate"]) == (0.3, 0.41, "rejected")
    assert "0.30 < 0.80" in error["message"]


def test_bad_input_gets_a_4xx_naming_it(hoster: Hoster) -> None:
    missing = hoster.send("POST", "/v1/deployments", json={"model": "ft:none:x:y"})
    assert missing.status_code == 404
    assert "ft:none:x:y" in missing.json()["detail"]
    assert hoster.send("POST", "/v1/deployments", json={}).status_code == 422
    assert hoster.send("GET", "/v1/deployments/dep-nope").status_code == 404
    body = {"tenant": hoster.tenant, "job_id": "j", "base_model": "gpt-9"}
    assert hoster.send("POST", "/internal/engines", json=body).status_code == 401  # tenant key
    bad = hoster.send("POST", "/internal/engines", json=body, headers=SERVICE_TOKEN)
    assert bad.status_code == 422
    assert "base_model" in bad.json()["detail"]
    ckpt = {"uri": "s3://x/y", "step": 1}
    nope = hoster.send(
        "POST", "/internal/engines/eng-x/checkpoints", json=ckpt, headers=SERVICE_TOKEN
    )
    assert nope.status_code == 404
    assert "eng-x" in nope.json()["detail"]


async def test_a_restarted_hoster_adopts_a_live_engine_and_restarts_a_dead_one(
    hoster: Hoster, broker: NatsBroker
) -> None:
    hoster_process = hoster.process
    job = "ftjob-restart"
    uri = store_checkpoint(hoster.store, hoster.work, tenant=hoster.tenant, job_id=job, step=10)
    event = decision(hoster.tenant, job, uri, auto_deploy=False)
    event_name = event.fine_tuned_model
    await bus.publish(broker, event)
    await next_event(
        broker,
        ModelRegistered,
        hoster.tenant,
        MODELS.name,
        60,
        skip=lambda registered: registered["model_id"] != event_name,
    )
    created = hoster.send("POST", "/v1/deployments", json={"model": event.fine_tuned_model})
    assert created.json()["status"] == "pending"
    ready = await next_event(
        broker,
        DeploymentReady,
        hoster.tenant,
        DEPLOYMENTS.name,
        300,
        skip=lambda event: event["served_model_name"] != event_name,
    )
    path = f"/v1/deployments/{ready['deployment_id']}"
    client = openai.OpenAI(base_url=ready["endpoint_url"], api_key="unused", max_retries=0)

    hoster_process.stop()  # deployments outlive the hoster...
    assert [m.id for m in client.models.list().data] == [event.fine_tuned_model]
    hoster_process.start()  # ...and a new one adopts the engine still serving
    assert hoster.get(path).json()["endpoint_url"] == ready["endpoint_url"]

    hoster_process.kill()
    with Session(db.make_engine(hoster.settings.database_url)) as session:
        row = session.get(Deployment, ready["deployment_id"])
        assert row is not None
        assert row.pid is not None
        engine_pid = row.pid  # the engine its base's versions share, in deployments/<engine id>
    os.killpg(engine_pid, signal.SIGKILL)
    hoster_process.start()  # the engine is gone: started again
    again = await next_event(
        broker,
        DeploymentReady,
        hoster.tenant,
        DEPLOYMENTS.name,
        300,
        skip=lambda event: (
            event["deployment_id"] != ready["deployment_id"]
            or event["event_id"] == ready["event_id"]
        ),
    )
    assert again["deployment_id"] == ready["deployment_id"]
    assert hoster.get(path).json()["status"] == "ready"
    client = openai.OpenAI(base_url=again["endpoint_url"], api_key="unused", max_retries=0)
    answer = client.chat.completions.create(
        model=event.fine_tuned_model,
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=3,
    )
    assert answer.choices
    assert hoster.send("DELETE", path).json()["status"] == "stopped"


def test_the_internal_engine_api_serves_the_evaluators_contract(hoster: Hoster) -> None:
    job = "ftjob-eval-http"
    body = {"tenant": hoster.tenant, "job_id": job, "base_model": BASE_ID}
    opened = hoster.send("POST", "/internal/engines", json=body, headers=SERVICE_TOKEN)
    assert opened.status_code == 200, opened.text
    engine = opened.json()
    assert engine["base_model_name"] == BASE_ID
    assert engine["base_url"].startswith("http://127.0.0.1:")
    same = hoster.send("POST", "/internal/engines", json=body, headers=SERVICE_TOKEN)
    assert same.json()["engine_id"] == engine["engine_id"]  # one engine per job and base

    uri = store_checkpoint(hoster.store, hoster.work, tenant=hoster.tenant, job_id=job, step=4)
    path = f"/internal/engines/{engine['engine_id']}"
    loaded = hoster.send(
        "POST", f"{path}/checkpoints", json={"uri": uri, "step": 4}, headers=SERVICE_TOKEN
    )
    assert loaded.status_code == 200, loaded.text
    client = openai.OpenAI(base_url=engine["base_url"], api_key="unused", max_retries=0)
    messages: Any = [{"role": "user", "content": "Hi"}]
    for model in (BASE_ID, loaded.json()["model"]):
        assert client.chat.completions.create(model=model, messages=messages, max_tokens=2).choices

    assert hoster.send("DELETE", path, headers=SERVICE_TOKEN).status_code == 204
    assert hoster.send("DELETE", path, headers=SERVICE_TOKEN).status_code == 404
    with pytest.raises(openai.APIConnectionError):
        client.models.list()


async def test_a_catalogue_base_is_deployed_under_its_id(
    hoster: Hoster, broker: NatsBroker
) -> None:
    created = hoster.send("POST", "/v1/deployments", json={"model": BASE_ID})
    assert created.status_code == 200, created.text
    assert (created.json()["model"], created.json()["version_id"]) == (BASE_ID, None)
    ready = await next_event(
        broker,
        DeploymentReady,
        hoster.tenant,
        DEPLOYMENTS.name,
        300,
        skip=lambda event: event["deployment_id"] != created.json()["id"],
    )
    assert (ready["served_model_name"], ready["version_id"]) == (BASE_ID, None)
    listed = [d for d in hoster.get("/v1/deployments").json()["data"] if d["model"] == BASE_ID]
    assert [(d["id"], d["status"]) for d in listed] == [(ready["deployment_id"], "ready")]
    again = hoster.send("POST", "/v1/deployments", json={"model": BASE_ID})
    assert again.json()["id"] == ready["deployment_id"]

    client = openai.OpenAI(base_url=ready["endpoint_url"], api_key="unused", max_retries=0)
    messages: Any = [{"role": "user", "content": "Hi"}]
    answer = client.chat.completions.create(model=BASE_ID, messages=messages, max_tokens=3)
    assert answer.choices[0].finish_reason is not None
    assert [m.id for m in client.models.list().data] == [BASE_ID]
    path = f"/v1/deployments/{ready['deployment_id']}"
    assert hoster.send("DELETE", path).json()["status"] == "stopped"


async def test_a_second_version_of_a_served_name_starts_as_its_canary_and_is_promoted_or_rolled_back(
    hoster: Hoster, broker: NatsBroker
) -> None:
    def changed(revision: int) -> Callable[[dict[str, Any]], bool]:
        return lambda event: event["name"] != "support" or event["revision"] != revision

    versions = {}
    for n, job in enumerate(("ftjob-support-1", "ftjob-support-2"), start=1):
        uri = store_checkpoint(
            hoster.store, hoster.work, tenant=hoster.tenant, job_id=job, step=10, seed=n
        )
        event = decision(hoster.tenant, job, uri, fine_tuned_model=f"ft:{BASE_ID}:support:{job}")
        await bus.publish(broker, event)
        state = await next_event(
            broker, ServedNameChanged, hoster.tenant, DEPLOYMENTS.name, 300, skip=changed(n)
        )
        versions[job] = state
    first, second = versions["ftjob-support-1"], versions["ftjob-support-2"]
    # The first auto-deployed version answers the job's suffix; the second shares it as a canary.
    assert first["primary"]["version_id"] is not None
    # The name its engine answers to, which the gateway sends in place of the served name.
    assert first["primary"]["model"] == f"ft:{BASE_ID}:support:ftjob-support-1"
    assert first["canary"] is None
    assert second["primary"] == first["primary"]
    assert second["canary"]["deployment_id"] != first["primary"]["deployment_id"]
    assert second["canary_percent"] == 10.0  # TUNELOOP_HOSTER_CANARY_PERCENT
    canary_id = second["canary"]["deployment_id"]
    listed = hoster.get("/v1/served_names").json()["data"]
    assert [(s["name"], s["canary"]) for s in listed if s["name"] == "support"] == [
        ("support", canary_id)
    ]
    assert hoster.get("/v1/served_names/nope").status_code == 404

    promoted = hoster.send("POST", "/v1/served_names/support/promote").json()
    assert (promoted["primary"], promoted["canary"]) == (canary_id, None)
    assert promoted["previous"] == first["primary"]["deployment_id"]
    assert hoster.send("POST", "/v1/served_names/support/promote").status_code == 409
    back = hoster.send("POST", "/v1/served_names/support/rollback").json()
    assert back["primary"] == first["primary"]["deployment_id"]
    rolled = await next_event(
        broker, DeploymentRolledBack, hoster.tenant, DEPLOYMENTS.name, 30,
        skip=lambda event: event["name"] != "support",
    )  # fmt: skip
    assert (rolled["deployment_id"], rolled["reason"]) == (canary_id, "rolled back by request")
    state = await next_event(
        broker, ServedNameChanged, hoster.tenant, DEPLOYMENTS.name, 30, skip=changed(4)
    )
    assert state["primary"]["deployment_id"] == first["primary"]["deployment_id"]
    for deployment in hoster.get("/v1/deployments").json()["data"]:
        if deployment["served_name"] == "support" and deployment["status"] == "ready":
            hoster.send("DELETE", f"/v1/deployments/{deployment['id']}")


async def test_an_engine_that_dies_is_started_again_and_announced_at_its_new_address(
    hoster: Hoster, broker: NatsBroker
) -> None:
    job = "ftjob-crashy"
    uri = store_checkpoint(hoster.store, hoster.work, tenant=hoster.tenant, job_id=job, step=10)
    event = decision(
        hoster.tenant, job, uri, auto_deploy=False, fine_tuned_model=f"ft:{BASE_ID}:x:{job}"
    )
    await bus.publish(broker, event)
    for _ in range(200):
        if hoster.get(f"/v1/models/{event.fine_tuned_model}").status_code == 200:
            break
        await asyncio.sleep(0.1)
    body = {"model": event.fine_tuned_model, "served_name": "crashy"}
    deployment_id = hoster.send("POST", "/v1/deployments", json=body).json()["id"]

    def ready_of(seen: set[str]) -> Callable[[dict[str, Any]], bool]:
        return lambda e: e["deployment_id"] != deployment_id or e["endpoint_url"] in seen

    first = await next_event(broker, DeploymentReady, hoster.tenant, DEPLOYMENTS.name, 300,
                             skip=ready_of(set()))  # fmt: skip
    with Session(db.make_engine(hoster.settings.database_url)) as session:
        row = session.get(Deployment, deployment_id)
        assert row is not None
        assert row.pid is not None
        os.kill(row.pid, signal.SIGKILL)
    again = await next_event(broker, DeploymentReady, hoster.tenant, DEPLOYMENTS.name, 300,
                             skip=ready_of({first["endpoint_url"]}))  # fmt: skip
    state = await next_event(
        broker, ServedNameChanged, hoster.tenant, DEPLOYMENTS.name, 30,
        skip=lambda e: e["name"] != "crashy" or e["primary"]["endpoint_url"] != again["endpoint_url"],
    )  # fmt: skip
    assert state["primary"]["deployment_id"] == deployment_id
    client = openai.OpenAI(base_url=again["endpoint_url"], api_key="unused", max_retries=0)
    answer = client.chat.completions.create(
        model=event.fine_tuned_model, messages=[{"role": "user", "content": "hi"}], max_tokens=3
    )
    assert answer.choices[0].finish_reason is not None
    assert hoster.get(f"/v1/deployments/{deployment_id}").json()["status"] == "ready"
    hoster.send("DELETE", f"/v1/deployments/{deployment_id}")


async def test_a_version_the_evaluator_found_worse_than_the_serving_one_is_not_its_canary(
    hoster: Hoster, broker: NatsBroker
) -> None:
    """The evaluator reads what serves a name (the internal route), loads that version's
    checkpoint in an eval engine under its id, and says whether the new version beats it: a
    worse one is registered only, a better one becomes the canary."""

    def changed(revision: int) -> Callable[[dict[str, Any]], bool]:
        return lambda event: event["name"] != "reports" or event["revision"] != revision

    async def decide(job: str, seed: int, **overrides: Any) -> dict[str, Any]:
        uri = store_checkpoint(
            hoster.store, hoster.work, tenant=hoster.tenant, job_id=job, step=10, seed=seed
        )
        name = f"ft:{BASE_ID}:reports:{job}"
        event = decision(hoster.tenant, job, uri, fine_tuned_model=name, **overrides)
        await bus.publish(broker, event)
        return await next_event(broker, ModelRegistered, hoster.tenant, MODELS.name, 60,
                                skip=lambda e: e["model_id"] != name)  # fmt: skip

    path = "/internal/tenants/{}/served_names/reports"
    nothing = hoster.send("GET", path.format(hoster.tenant), headers=SERVICE_TOKEN)
    assert nothing.json() == {"name": "reports", "primary": None}
    serving = await decide("ftjob-reports-1", 1)
    state = await next_event(
        broker, ServedNameChanged, hoster.tenant, DEPLOYMENTS.name, 300, skip=changed(1)
    )
    found = hoster.send("GET", path.format(hoster.tenant), headers=SERVICE_TOKEN).json()
    assert found["primary"] == {
        "deployment_id": state["primary"]["deployment_id"],
        "version_id": serving["version_id"], "version": 1,
        "model": f"ft:{BASE_ID}:reports:ftjob-reports-1", "base_model": BASE_ID,
        "checkpoint_uri": serving["artifact_uri"],
    }  # fmt: skip
    assert hoster.send("GET", path.format(hoster.tenant)).status_code == 401  # a tenant's key
    other = hoster.send("GET", path.format("tother00001"), headers=SERVICE_TOKEN)
    assert other.json()["primary"] is None  # another tenant's name of the same spelling
    assert hoster.send("GET", path.format("Bad!"), headers=SERVICE_TOKEN).status_code == 422

    # The registered artifact loads in an eval engine as a checkpoint, under the version's id.
    body = {"tenant": hoster.tenant, "job_id": "ftjob-reports-3", "base_model": BASE_ID}
    engine = hoster.send("POST", "/internal/engines", json=body, headers=SERVICE_TOKEN).json()
    load = {"uri": serving["artifact_uri"], "step": 0, "version_id": serving["version_id"]}
    loaded = hoster.send("POST", f"/internal/engines/{engine['engine_id']}/checkpoints",
                         json=load, headers=SERVICE_TOKEN)  # fmt: skip
    assert loaded.json() == {"model": f"ftjob-reports-3:{serving['version_id']}"}
    client = openai.OpenAI(base_url=engine["base_url"], api_key="unused", max_retries=0)
    messages: Any = [{"role": "user", "content": "Hi"}]
    assert client.chat.completions.create(
        model=loaded.json()["model"], messages=messages, max_tokens=2
    ).choices
    hoster.send("DELETE", f"/internal/engines/{engine['engine_id']}", headers=SERVICE_TOKEN)

    said = "The new version scored 0.810 ...: not deployed as a canary."
    worse = await decide(
        "ftjob-reports-2", 2, best_score=0.81, serving_version_id=serving["version_id"],
        serving_score=0.84, beats_serving=False, gate_reason=said,
    )  # fmt: skip
    # The hoster says why in its log once it has decided; then nothing was deployed for it.
    line = f"{worse['model_id']} v1 registered, not deployed as reports's canary"
    async with asyncio.timeout(30):
        while line not in hoster.process.log():
            await asyncio.sleep(0.1)
    versions = [d["version_id"] for d in hoster.get("/v1/deployments").json()["data"]]
    assert worse["version_id"] not in versions
    assert hoster.get("/v1/served_names/reports").json()["canary"] is None
    listed = hoster.get(f"/v1/models/{worse['version_id']}").json()
    assert listed["gate_reason"] == said  # registered, with the evaluator's words

    better = await decide(
        "ftjob-reports-3", 3, serving_version_id=serving["version_id"], serving_score=0.84,
        beats_serving=True,
    )  # fmt: skip
    state = await next_event(
        broker, ServedNameChanged, hoster.tenant, DEPLOYMENTS.name, 300, skip=changed(2)
    )
    assert state["canary"]["version_id"] == better["version_id"]
    assert state["primary"]["version_id"] == serving["version_id"]
    for deployment in hoster.get("/v1/deployments").json()["data"]:
        if deployment["served_name"] == "reports" and deployment["status"] == "ready":
            hoster.send("DELETE", f"/v1/deployments/{deployment['id']}")

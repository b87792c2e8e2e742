"""The fine-tuning jobs API through the gateway with the official openai SDK, on real processes
(ingest, scheduler, nats-server, SeaweedFS, SQLite, the trainer on SmolLM2-135M): files become a
dataset, the job is planned with explained decisions and launched, cancelled; bad requests are
refused naming the field."""

from __future__ import annotations

import io
import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from shared import db
from shared.catalogue import MODELS_DIR_NAME, SMOLLM2_135M_INSTRUCT
from shared.dev import localstack
from shared.dev.demo.tickets import answer_json, generate
from shared.settings import Settings
from tests.plugins.infra import RunningProcess, make_settings, settings_env

ADMIN = {"Authorization": "Bearer tuneloop-dev-admin"}
BASE = SMOLLM2_135M_INSTRUCT.id


@dataclass
class Loop:
    client: openai.OpenAI
    reader: openai.OpenAI
    settings: Settings


def _key(url: str, tenant: str, scope: str) -> str:
    httpx.post(f"{url}/v1/admin/tenants", json={"id": tenant, "name": tenant}, headers=ADMIN)
    response = httpx.post(
        f"{url}/v1/admin/tenants/{tenant}/api_keys",
        json={"name": scope, "scope": scope},
        headers=ADMIN,
    )
    assert response.status_code == 201, response.text
    return str(response.json()["key"])


@pytest.fixture(scope="module")
def loop(
    nats_server: RunningProcess,
    s3_server: RunningProcess,
    stack_settings: Settings,
    smollm2_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Loop]:
    tmp = tmp_path_factory.mktemp("loop")
    settings = make_settings(tmp, infra=stack_settings)
    (tmp / MODELS_DIR_NAME).mkdir()
    (tmp / MODELS_DIR_NAME / BASE).symlink_to(smollm2_dir.resolve(), target_is_directory=True)
    db.migrate(settings.database_url)
    env = settings_env(settings) | {
        "TUNELOOP_SCHEDULER_POLL_INTERVAL_S": "0.5",
        "TUNELOOP_SCHEDULER_RETRAIN_INTERVAL_S": "0.5",
    }
    processes = []
    try:
        for name in ("ingest", "scheduler"):
            process = RunningProcess(
                localstack.component(settings, name), tmp / "logs" / f"{name}.log", env=env
            )
            process.start(timeout_s=90)
            processes.append(process)
        url = f"http://127.0.0.1:{settings.services.ingest_port}"
        yield Loop(
            openai.OpenAI(base_url=f"{url}/v1", api_key=_key(url, "acme", "write"), max_retries=0),
            openai.OpenAI(base_url=f"{url}/v1", api_key=_key(url, "acme", "read"), max_retries=0),
            settings,
        )
    finally:
        for process in reversed(processes):
            process.stop()


def _jsonl(tickets: list[Any]) -> bytes:
    lines = [
        {"messages": [*t.messages(), {"role": "assistant", "content": answer_json(t.answer)}]}
        for t in tickets
    ]
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def _upload(client: openai.OpenAI, name: str, tickets: list[Any]) -> str:
    uploaded = client.files.create(file=(name, io.BytesIO(_jsonl(tickets))), purpose="fine-tune")
    deadline = time.monotonic() + 60
    while client.files.retrieve(uploaded.id).status != "processed":
        assert time.monotonic() < deadline
        time.sleep(0.3)
    return uploaded.id


def _until(client: openai.OpenAI, job_id: str, statuses: set[str], timeout_s: float = 120) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        job = client.fine_tuning.jobs.retrieve(job_id)
        if job.status in statuses:
            return job
        assert time.monotonic() < deadline, f"job still {job.status}: {job}"
        time.sleep(0.5)


@pytest.mark.slow
def test_a_job_from_uploaded_files_is_planned_explained_launched_and_cancelled(loop: Loop) -> None:
    train, heldout = generate("train")[:120], generate("heldout")[:24]
    training_file = _upload(loop.client, "train.jsonl", train)
    validation_file = _upload(loop.client, "valid.jsonl", heldout)
    job = loop.client.fine_tuning.jobs.create(
        model=BASE,
        training_file=training_file,
        validation_file=validation_file,
        suffix="tickets",
        seed=3,
        method={"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 1}}},
        extra_body={"max_duration_s": 600},
    )
    assert job.status == "validating_files"
    assert job.model == BASE
    job = _until(loop.client, job.id, {"queued", "running"})
    assert job.hyperparameters is not None
    assert job.hyperparameters.n_epochs == 1
    decisions = {d["name"]: d for d in job.decisions}  # type: ignore[attr-defined]
    assert decisions["n_epochs"]["source"] == "user"
    assert decisions["task_kind"]["value"] == "json"
    assert "JSON" in decisions["task_kind"]["reason"]
    assert decisions["learning_rate"]["reason"]
    messages = [e.message for e in loop.client.fine_tuning.jobs.list_events(job.id, limit=50).data]
    assert any(m.startswith("task_kind = json") for m in messages)
    assert any(m.startswith("Planned ") for m in messages)
    assert job.id in [j.id for j in loop.reader.fine_tuning.jobs.list(limit=10).data]
    cancelled = loop.client.fine_tuning.jobs.cancel(job.id)
    assert cancelled.status == "cancelled"
    assert cancelled.finished_at is not None
    with pytest.raises(openai.ConflictError, match="already cancelled"):
        loop.client.fine_tuning.jobs.cancel(job.id)


@pytest.mark.slow
def test_bad_requests_are_refused_naming_the_field(loop: Loop) -> None:
    client = loop.client
    with pytest.raises(openai.UnprocessableEntityError, match="model"):
        client.fine_tuning.jobs.create(model="gpt-4o-mini", training_file="file-x")
    with pytest.raises(openai.UnprocessableEntityError, match="n_epochs"):
        client.fine_tuning.jobs.create(
            model=BASE, training_file="file-x", hyperparameters={"n_epochs": 0}
        )
    with pytest.raises(openai.NotFoundError, match="training_file"):
        client.fine_tuning.jobs.create(model=BASE, training_file="file-000000000000000000000000")
    with pytest.raises(openai.NotFoundError, match="training_file"):
        client.fine_tuning.jobs.create(model=BASE, training_file="ds_missing")
    with pytest.raises(openai.UnprocessableEntityError, match="training_file"):
        client.fine_tuning.jobs.create(model=BASE, training_file="neither")
    with pytest.raises(openai.PermissionDeniedError):
        loop.reader.fine_tuning.jobs.create(model=BASE, training_file="file-x")
    with pytest.raises(openai.NotFoundError):
        client.fine_tuning.jobs.retrieve("ftjob-missing")


@pytest.mark.slow
def test_a_tenant_past_its_monthly_budget_gets_429_with_the_numbers(loop: Loop) -> None:
    url = f"http://127.0.0.1:{loop.settings.services.ingest_port}"
    admin = openai.OpenAI(base_url=f"{url}/v1", api_key=_key(url, "capped", "admin"), max_retries=0)
    writer = openai.OpenAI(
        base_url=f"{url}/v1", api_key=_key(url, "capped", "write"), max_retries=0
    )
    with pytest.raises(openai.PermissionDeniedError, match="admin"):
        writer.put("/fine_tuning/budget", body={"monthly_cost_cap": 100}, cast_to=object)
    with pytest.raises(openai.UnprocessableEntityError, match="monthly_cost_cap"):
        admin.put("/fine_tuning/budget", body={"monthly_cost_cap": -1}, cast_to=object)
    # A cap of 0: nothing may be spent, so the next job is refused before anything else.
    budget = admin.put("/fine_tuning/budget", body={"monthly_cost_cap": 0}, cast_to=dict[str, Any])
    assert budget["effective_monthly_cost_cap"] == 0
    assert budget["spent"] == 0
    assert writer.get("/fine_tuning/budget", cast_to=dict[str, Any]) == budget
    with pytest.raises(
        openai.RateLimitError, match=r"monthly training budget spent: 0\.00 of 0\.00"
    ):
        writer.fine_tuning.jobs.create(model=BASE, training_file="file-000000000000000000000000")
    admin.put("/fine_tuning/budget", body={"monthly_cost_cap": None}, cast_to=object)
    # Past the budget check now: the missing file is what is refused.
    with pytest.raises(openai.NotFoundError, match="training_file"):
        writer.fine_tuning.jobs.create(model=BASE, training_file="file-000000000000000000000000")


@pytest.mark.slow
def test_a_retrain_policy_runs_when_enough_new_traffic_arrived_and_once_at_a_time(
    loop: Loop,
) -> None:
    url = f"http://127.0.0.1:{loop.settings.services.ingest_port}"
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=_key(url, "loopy", "write"), max_retries=0)
    other = openai.OpenAI(base_url=f"{url}/v1", api_key=_key(url, "nosy", "write"), max_retries=0)
    policies = "/fine_tuning/retrain_policies"
    policy = {
        "name": "tickets",
        "source": {"sources": ["upload"]},
        "trigger": {"min_new_samples": 100},
        "job": {"model": BASE, "suffix": "auto", "max_duration_s": 120},
    }
    with pytest.raises(openai.UnprocessableEntityError, match=r"source\.sorce"):
        client.post(
            policies, body={**policy, "source": {"sorce": ["upload"]}}, cast_to=dict[str, Any]
        )
    with pytest.raises(openai.UnprocessableEntityError, match=r"job\.model"):
        client.post(policies, body={**policy, "job": {"model": "gpt-4o"}}, cast_to=dict[str, Any])
    with pytest.raises(openai.UnprocessableEntityError, match="trigger"):
        client.post(policies, body={**policy, "trigger": {}}, cast_to=dict[str, Any])
    created = client.post(policies, body=policy, cast_to=dict[str, Any])
    path = f"{policies}/{created['id']}"
    assert (created["runs"], created["last_job_id"], created["watermark"]) == (0, None, None)
    with pytest.raises(openai.ConflictError, match="name"):
        client.post(policies, body=policy, cast_to=dict[str, Any])
    with pytest.raises(openai.NotFoundError):
        other.get(path, cast_to=dict[str, Any])
    # What the scheduler asks ingest for a tenant takes the service token, not a tenant's key.
    counted = httpx.post(
        f"{url}/internal/tenants/loopy/samples/count",
        json={"source": {}},
        headers={"Authorization": f"Bearer {client.api_key}"},
    )
    assert counted.status_code == 401, counted.text

    tickets = generate("train")
    _upload(client, "a.jsonl", tickets[:60])
    time.sleep(2.0)  # four checks pass: 60 new samples are below the trigger
    assert client.get(path, cast_to=dict[str, Any])["runs"] == 0
    _upload(client, "b.jsonl", tickets[60:120])
    deadline = time.monotonic() + 30
    while (state := client.get(path, cast_to=dict[str, Any]))["runs"] == 0:
        assert time.monotonic() < deadline, state
        time.sleep(0.3)
    assert state["last_error"] is None
    job = client.fine_tuning.jobs.retrieve(state["last_job_id"])
    assert job.metadata == {"retrain_policy": created["id"]}
    assert job.training_file == state["last_dataset_id"]
    messages = [e.message for e in client.fine_tuning.jobs.list_events(job.id, limit=50).data]
    # The persister may still be storing the last of the 120 when the count passes 100.
    started = r"Started by retrain policy 'tickets' \(run 1\): 1[0-2]\d new samples \(the trigger is 100\)"
    assert any(re.fullmatch(started, m) for m in messages), messages
    _until(client, job.id, {"queued", "running"})  # its dataset was built, its job planned
    # Its job has not ended: a run now is refused, and the loop starts none.
    with pytest.raises(openai.ConflictError, match="has not ended"):
        client.post(f"{path}/run", cast_to=dict[str, Any])
    _upload(client, "c.jsonl", tickets[120:230])
    time.sleep(2.0)
    assert client.get(path, cast_to=dict[str, Any])["runs"] == 1
    client.fine_tuning.jobs.cancel(job.id)
    # Ended: 110 samples arrived after the first run's cutoff, past the trigger again.
    deadline = time.monotonic() + 30
    while (state := client.get(path, cast_to=dict[str, Any]))["runs"] == 1:
        assert time.monotonic() < deadline, state
        time.sleep(0.3)
    second = client.fine_tuning.jobs.retrieve(state["last_job_id"])
    assert second.id != job.id
    client.fine_tuning.jobs.cancel(second.id)
    # A policy that counts from now: the 230 samples captured before do not make it due.
    since = int(time.time())
    fresh = client.post(
        policies, body={**policy, "name": "from-now", "new_since": since}, cast_to=dict[str, Any]
    )
    assert fresh["watermark"] == since
    time.sleep(2.0)
    assert client.get(f"{policies}/{fresh['id']}", cast_to=dict[str, Any])["runs"] == 0
    client.delete(f"{policies}/{fresh['id']}", cast_to=dict[str, Any])
    disabled = client.post(path, body={"enabled": False}, cast_to=dict[str, Any])
    assert disabled["enabled"] is False
    assert [p["id"] for p in client.get(policies, cast_to=dict[str, Any])["data"]] == [
        created["id"]
    ]
    assert client.delete(path, cast_to=dict[str, Any])["deleted"] is True

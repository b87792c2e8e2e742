"""The fine-tuning jobs API through the gateway with the official openai SDK, on real processes
(ingest, scheduler, nats-server, SeaweedFS, SQLite, the trainer on SmolLM2-135M): files become a
dataset, the job is planned with explained decisions and launched, cancelled; bad requests are
refused naming the field."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from shared import db, localstack
from shared.catalogue import MODELS_DIR_NAME, SMOLLM2_135M_INSTRUCT
from shared.demo.tickets import answer_json, generate
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
    env = settings_env(settings) | {"TUNELOOP_SCHEDULER_POLL_INTERVAL_S": "0.5"}
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

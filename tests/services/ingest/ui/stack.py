"""The dashboard's test stack: a nats-server of its own, SeaweedFS, a migrated SQLite, and ingest
(the gateway, with the dashboard), the hoster, the evaluator and the scheduler (its local provider
runs the real trainer) as processes on the tiny Llama; a tenant with a write and a read key,
another tenant, and a real fine-tuning job started through the gateway with the openai SDK on
uploaded files (one word to learn, as in tests/integration/test_retrain_loop.py)."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
from sqlmodel import Session

from services.hoster.engines import stop_leftovers
from shared import auth, db
from shared.dev import localstack
from shared.settings import Settings
from tests.plugins.infra import RunningProcess, make_settings, settings_env
from tests.plugins.waiting import until
from tests.services.hoster.checkpoints import BASE_ID
from tests.services.hoster.process import prepare

LABEL = "billing"
SUFFIX = "ui-desk"
ITEMS = 8  # training examples, and as many held out (the evaluator's items)
_WORDS = ("invoice", "refund", "card", "plan", "receipt", "charge", "tax", "discount")


@dataclass
class Stack:
    url: str  # the gateway's base URL (the dashboard is at /ui)
    tenant: str
    key: str  # write
    read_key: str
    other_key: str  # another tenant's (write)
    client: openai.OpenAI  # the tenant's, through the gateway
    job_id: str
    processes: list[RunningProcess] = field(default_factory=list)

    def job(self) -> Any:
        return self.client.fine_tuning.jobs.retrieve(self.job_id)

    def get(self, path: str) -> dict[str, Any]:
        return self.client.get(path, cast_to=dict[str, Any])


def secret_of(key: str) -> str:
    match = auth.KEY_PATTERN.fullmatch(key)
    assert match is not None
    return match[2]


def _jsonl(numbers: range) -> bytes:
    lines = []
    for n in numbers:
        question = f"Ticket {n}: a question about my {_WORDS[n % 8]} and {_WORDS[n // 8 % 8]}."
        messages = [{"role": "user", "content": question}, {"role": "assistant", "content": LABEL}]
        lines.append(json.dumps({"messages": messages}) + "\n")
    return "".join(lines).encode()


def _upload(client: openai.OpenAI, name: str, numbers: range) -> str:
    uploaded = client.files.create(file=(name, io.BytesIO(_jsonl(numbers))), purpose="fine-tune")
    until(
        f"{name} processed",
        lambda: True if client.files.retrieve(uploaded.id).status == "processed" else None,
        60,
    )
    return uploaded.id


def _start_job(client: openai.OpenAI) -> str:
    training = _upload(client, "train.jsonl", range(ITEMS))
    validation = _upload(client, "heldout.jsonl", range(ITEMS, 2 * ITEMS))
    job = client.fine_tuning.jobs.create(
        model=BASE_ID,
        training_file=training,
        validation_file=validation,
        suffix=SUFFIX,
        seed=0,
        # As the retrain loop's: enough steps for the tiny model to say the label and stop.
        method={
            "type": "supervised",
            "supervised": {
                "hyperparameters": {"n_epochs": 20, "batch_size": 1, "learning_rate_multiplier": 10}
            },
        },
    )
    return job.id


def _keys(settings: Settings, tenant: str) -> tuple[str, str]:
    """A read key of the tenant, and a write key of another tenant."""
    with Session(db.make_engine(settings.database_url)) as session:
        _, read_key = auth.issue_api_key(session, tenant_id=tenant, name="reader", scope="read")
        other = f"{tenant}-other"
        auth.create_tenant(session, tenant_id=other, name=other)
        _, other_key = auth.issue_api_key(session, tenant_id=other, name="other")
    return read_key, other_key


@contextmanager
def running(tmp: Path, stack_settings: Settings, model_dir: Path) -> Iterator[Stack]:
    prepared = prepare(tmp, stack_settings, model_dir)
    settings = prepared.settings
    read_key, other_key = _keys(settings, prepared.tenant)
    # A nats-server of its own (test_retrain_loop.py says why: consumers left with unacked events).
    own_nats = make_settings(tmp / "nats")
    env = settings_env(settings) | {
        "TUNELOOP_SCHEDULER_POLL_INTERVAL_S": "0.5",
        "TUNELOOP_SCHEDULER_TRAINER_THREADS": "1",
        "TUNELOOP_HOSTER_ENGINE_LOAD_TIMEOUT_S": "240",
        "TUNELOOP_HOSTER_WATCH_INTERVAL_S": "0.5",
    }  # fmt: skip
    env |= {k: v for k, v in settings_env(own_nats).items() if k.startswith("TUNELOOP_NATS_")}
    processes = [RunningProcess(localstack.component(own_nats, "nats"), tmp / "logs" / "nats.log")]
    processes[0].start()
    try:
        for name in ("ingest", "hoster", "evaluator", "scheduler"):
            process = RunningProcess(
                localstack.component(settings, name), tmp / "logs" / f"{name}.log", env=env
            )
            process.start(timeout_s=90)
            processes.append(process)
        url = f"http://127.0.0.1:{settings.services.ingest_port}"
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=prepared.key, max_retries=0)
        keys = (prepared.key, read_key, other_key)
        yield Stack(url, prepared.tenant, *keys, client, _start_job(client), processes)
    finally:
        for process in reversed(processes):
            process.stop()
        stop_leftovers(tmp / "hoster" / "deployments")  # deployments outlive the hoster
    _check_logs(processes, (prepared.key, read_key, other_key))


def _check_logs(processes: list[RunningProcess], keys: tuple[str, ...]) -> None:
    """No service logged an error (FastStream's own supervisor aside, as in the retrain loop's
    test), and no key was ever written to a log."""
    logs = {process.component.name: process.log() for process in processes}
    errors = [
        line
        for text in logs.values()
        for line in text.splitlines()
        if '"level":"ERROR"' in line and '.faststream"' not in line
    ]
    assert not errors, errors
    for name, text in logs.items():
        for key in keys:
            assert key not in text, f"a key is in {name}'s log"
            assert secret_of(key) not in text, f"a key's secret part is in {name}'s log"

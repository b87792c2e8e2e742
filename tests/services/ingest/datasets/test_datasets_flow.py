"""Dataset builds end to end on a running ingest service (real NATS, S3, SQLite): from traffic
captured through the gateway, from an uploaded OpenAI fine-tune file, rebuilt to the same
version, exported, and resumed after the worker is SIGKILLed mid-build."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from services.ingest.datasets.cleaning.report import CleaningReport
from shared import bus, db
from shared.catalogue import SMOLLM2_135M_INSTRUCT
from shared.dev import localstack
from shared.events import DatasetBuildRequested
from shared.settings import Settings
from shared.storage import ObjectStore
from tests.fakes.upstream import recorded
from tests.plugins.infra import (
    RunningProcess,
    settings_env,
    settings_on_private_nats,
)
from tests.plugins.models import build_tiny_tokenizer
from tests.plugins.tenants import tenant_key
from tests.services.ingest.conftest import Edge
from tests.services.ingest.datasets.test_datasets_api import auth, post, store_samples

PROMPTS = [
    "What's the weather like in Paris today?",
    "Should I bring an umbrella to Berlin tomorrow morning?",
    "Is it warm enough for the beach in Barcelona this weekend?",
    "How cold will it get in Oslo tonight, in celsius please?",
    "Compare the temperature in Tokyo and Osaka right now.",
    "Will it snow in Denver on Friday afternoon?",
    "My flight lands in Lisbon at noon: sunny or rainy?",
    "Give me the humidity in Singapore, I am packing for a trip.",
    "Is there a storm warning for Miami this evening?",
    "Tell me if the wind in Chicago is too strong for cycling.",
]
FINE_TUNE_LINES = [
    {
        "messages": [
            {"role": "system", "content": "You answer arithmetic questions tersely."},
            {"role": "user", "content": f"Compute {a} times {b}, and explain in words why."},
            {"role": "assistant", "content": f"{a * b}: {a} groups of {b} make {a * b}."},
        ]
    }
    for a, b in [(3, 7), (12, 11), (9, 9), (25, 4), (16, 3), (8, 13), (21, 5), (14, 6), (7, 19)]
]


@pytest.fixture(scope="module")
def tokenizer_prefix(edge: Edge, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A base model of the tenant's own (its tokenizer), under the tenant's S3 prefix."""
    path = tmp_path_factory.mktemp("tokenizer")
    build_tiny_tokenizer().save_pretrained(path)
    store = ObjectStore.from_settings(edge.settings.s3)
    store.put_dir(path, "tenants/acme/models/tiny")
    return store.uri("tenants/acme/models/tiny/")


def wait_finished(url: str, key: str, dataset_id: str, timeout_s: float = 120) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    def finished() -> bool:
        nonlocal seen
        response = httpx.get(f"{url}/v1/datasets/{dataset_id}", headers=auth(key))
        response.raise_for_status()
        seen = response.json()
        return seen["status"] in ("built", "failed")

    assert localstack.wait_until(finished, timeout_s, interval_s=0.25), seen
    return seen


def check_report(dataset: dict[str, Any], selected: int) -> None:
    """The cleaning report's counts add up, from the selection to train + eval."""
    assert dataset["status"] == "built", dataset["error"]
    report = CleaningReport.from_dict(dataset["report"])
    assert report.input_count == selected
    for before, after in zip(report.steps, report.steps[1:], strict=False):
        assert after.samples_in == before.samples_out
    assert report.input_count - report.removed == dataset["train_count"] + dataset["eval_count"]
    assert report.output_count == dataset["train_count"] + dataset["eval_count"]
    assert dataset["eval_count"] >= 1
    assert dataset["stats"]["train"]["count"] == dataset["train_count"]
    assert dataset["uri"].endswith(f"/datasets/{dataset['version']}/")
    steps = [step["step"] for step in dataset["progress"]["steps"]]
    assert steps[0] == "select"
    assert steps[-1] == "snapshot"


def export(edge: Edge, dataset_id: str, split: str) -> list[dict[str, Any]]:
    response = httpx.get(
        f"{edge.url}/v1/datasets/{dataset_id}/export",
        params={"split": split},
        headers=auth(edge.key),
    )
    assert response.status_code == 200, response.text
    return [json.loads(line) for line in response.text.splitlines()]


def test_dataset_from_gateway_traffic(edge: Edge, tokenizer_prefix: str) -> None:
    tag = f"flow-{uuid.uuid4().hex[:8]}"
    client = openai.OpenAI(base_url=f"{edge.url}/v1", api_key=edge.key, max_retries=0)
    request = recorded("oa01_tool_calls_multiturn")["request"]["body"]
    for prompt in PROMPTS:
        client.chat.completions.create(
            **{**request, "messages": [{"role": "user", "content": prompt}]},
            extra_headers={"x-tuneloop-tags": tag},
        )
    edge.wait_for_samples(len(PROMPTS), tag=tag)

    spec = {
        "name": "weather",
        "base_model": tokenizer_prefix,
        "source": {"tags": [tag], "sources": ["gateway"]},
        "split": {"eval_size": 2, "seed": 7},
    }
    first = post(edge.url, edge.key, spec)
    second = post(edge.url, edge.key, spec)
    assert first.status_code == second.status_code == 202
    built = wait_finished(edge.url, edge.key, first.json()["id"])
    check_report(built, selected=len(PROMPTS))
    assert built["stats"]["tokenizer"] != "approx:chars/4"
    again = wait_finished(edge.url, edge.key, second.json()["id"])
    assert again["version"] == built["version"]

    train = export(edge, built["id"], "train")
    assert len(train) == built["train_count"]
    assert all(record["messages"][-1]["tool_calls"] for record in train)


@pytest.mark.slow
def test_a_dataset_naming_a_catalogue_model_counts_in_its_tokenizer(
    edge: Edge, smollm2_dir: Path
) -> None:
    # Where `make up` (make model) leaves it in the service's data dir.
    models = edge.settings.app.data_dir / "models"
    models.mkdir(parents=True, exist_ok=True)
    (models / SMOLLM2_135M_INSTRUCT.id).symlink_to(smollm2_dir.resolve())
    tag = f"smol-{uuid.uuid4().hex[:8]}"
    store_samples(edge.settings.database_url, "acme", tag, 6)
    spec = {
        "name": "smol",
        "base_model": SMOLLM2_135M_INSTRUCT.id,
        "source": {"tags": [tag]},
        "split": {"eval_size": 1},
    }
    created = post(edge.url, edge.key, spec)
    assert created.status_code == 202, created.text
    built = wait_finished(edge.url, edge.key, created.json()["id"])
    check_report(built, selected=6)
    assert built["stats"]["tokenizer"].endswith(SMOLLM2_135M_INSTRUCT.id)


def _upload(edge: Edge, path: Path) -> str:
    client = openai.OpenAI(base_url=f"{edge.url}/v1", api_key=edge.key, max_retries=0)
    created = client.files.create(file=path.open("rb"), purpose="fine-tune")
    assert localstack.wait_until(
        lambda: client.files.retrieve(created.id).status == "processed", 30, interval_s=0.2
    )
    return created.id


def test_dataset_from_an_uploaded_file_exports_what_was_imported(
    edge: Edge, tmp_path: Path
) -> None:
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in FINE_TUNE_LINES))
    file_id = _upload(edge, path)
    # No waiting for the samples: the build waits until the import's samples are all stored.
    spec = {"name": "arithmetic", "file_ids": [file_id], "split": {"eval_size": 2}}
    created = post(edge.url, edge.key, spec)
    assert created.status_code == 202, created.text
    built = wait_finished(edge.url, edge.key, created.json()["id"])
    check_report(built, selected=len(FINE_TUNE_LINES))

    exported = export(edge, built["id"], "train") + export(edge, built["id"], "eval")
    assert len(exported) == built["train_count"] + built["eval_count"]
    # Import then export is the identity on what cleaning kept.
    uploaded = [json.dumps(line, sort_keys=True) for line in FINE_TUNE_LINES]
    assert {json.dumps(record, sort_keys=True) for record in exported} <= set(uploaded)

    rebuilt = wait_finished(edge.url, edge.key, post(edge.url, edge.key, spec).json()["id"])
    assert rebuilt["version"] == built["version"]


def _write_lines(path: Path, lines: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_a_validation_file_is_the_eval_split_exactly(edge: Edge, tmp_path: Path) -> None:
    validation = FINE_TUNE_LINES[-3:]
    train_id = _upload(edge, _write_lines(tmp_path / "train.jsonl", FINE_TUNE_LINES[:-3]))
    eval_id = _upload(edge, _write_lines(tmp_path / "validation.jsonl", validation))
    spec = {"name": "validated", "file_ids": [train_id], "eval_file_ids": [eval_id]}
    created = post(edge.url, edge.key, spec)
    assert created.status_code == 202, created.text
    built = wait_finished(edge.url, edge.key, created.json()["id"])
    check_report(built, selected=len(FINE_TUNE_LINES))
    assert (built["train_count"], built["eval_count"]) == (len(FINE_TUNE_LINES) - 3, 3)
    assert built["stats"]["eval"]["count"] == 3

    def lines(records: list[dict[str, Any]]) -> list[str]:
        return sorted(json.dumps(record, sort_keys=True) for record in records)

    assert lines(export(edge, built["id"], "eval")) == lines(validation)
    assert lines(export(edge, built["id"], "train")) == lines(FINE_TUNE_LINES[:-3])

    # Refused up front, naming the field: a file on both sides, an eval size besides the
    # files, an eval file that does not exist.
    both = post(edge.url, edge.key, spec | {"file_ids": [train_id, eval_id]})
    assert both.status_code == 422
    assert "eval_file_ids[0]" in both.text
    sized = post(edge.url, edge.key, spec | {"split": {"eval_size": 2}})
    assert sized.status_code == 422
    assert "split.eval_size" in sized.text
    unknown = post(edge.url, edge.key, spec | {"eval_file_ids": ["file-nope"]})
    assert unknown.status_code == 404
    assert "eval_file_ids[0]" in unknown.json()["detail"]


async def _publish(settings: Settings, event: DatasetBuildRequested) -> None:
    broker = bus.make_broker(settings.nats, service="test-producer")
    await bus.connect(broker, settings.nats)
    try:
        await bus.publish(broker, event)
    finally:
        await broker.stop()


def test_a_redelivered_request_for_a_built_dataset_changes_nothing(edge: Edge) -> None:
    tag = f"redo-{uuid.uuid4().hex[:8]}"
    store_samples(edge.settings.database_url, "acme", tag, 6)
    spec = {"name": "redo", "source": {"tags": [tag]}, "split": {"eval_size": 1}}
    built = wait_finished(edge.url, edge.key, post(edge.url, edge.key, spec).json()["id"])
    assert built["status"] == "built"
    duplicate = DatasetBuildRequested(tenant="acme", dataset_id=built["id"], spec=built["spec"])
    asyncio.run(_publish(edge.settings, duplicate))
    # Builds are consumed in order, one at a time: once a later one is done, so is the duplicate.
    later = wait_finished(edge.url, edge.key, post(edge.url, edge.key, spec).json()["id"])
    assert later["version"] == built["version"]
    after = httpx.get(f"{edge.url}/v1/datasets/{built['id']}", headers=auth(edge.key)).json()
    assert after == built


def test_a_build_failing_on_its_data_says_why(edge: Edge) -> None:
    tag = f"fail-{uuid.uuid4().hex[:8]}"
    store_samples(edge.settings.database_url, "acme", tag, 3)
    # Metadata is checked at build time only: nothing matches, so the build fails, saying so.
    spec = {"name": "none", "source": {"tags": [tag], "metadata": {"team": "nobody"}}}
    created = post(edge.url, edge.key, spec)
    assert created.status_code == 202
    failed = wait_finished(edge.url, edge.key, created.json()["id"])
    assert failed["status"] == "failed"
    assert "empty selection" in failed["error"]
    assert failed["version"] is None


# --- a killed worker ----------------------------------------------------------------------------


def _ingest(settings: Settings, tmp_path: Path, **dataset_env: str) -> RunningProcess:
    env = settings_env(settings) | {
        f"TUNELOOP_INGEST_DATASET_{name.upper()}": value for name, value in dataset_env.items()
    }
    component = localstack.component(settings, "ingest")
    return RunningProcess(component, tmp_path / "ingest.log", env=env)


KILLED = 8_000


@pytest.mark.slow
def test_a_build_killed_mid_way_restarts_cleanly_to_the_same_version(
    private_nats: RunningProcess,
    s3_server: RunningProcess,
    stack_settings: Settings,
    tmp_path: Path,
) -> None:
    settings = settings_on_private_nats(tmp_path / "svc", private_nats, stack_settings)
    db.migrate(settings.database_url)
    url = f"http://127.0.0.1:{settings.services.ingest_port}"
    # Short ack_wait so the killed build's event comes back quickly. 8,000 samples take seconds
    # to clean and split (~2,000 a second, docs/benchmarks.md): the kill, sent once the first
    # step is recorded, lands mid-build.
    first = _ingest(settings, tmp_path, ack_wait_s="4")
    first.start()
    try:
        key = tenant_key(url)
        store_samples(settings.database_url, "acme", "killed", KILLED)
        spec = {"name": "killed", "source": {"tags": ["killed"]}, "split": {"eval_size": 4}}
        dataset_id = post(url, key, spec).json()["id"]

        def mid_build() -> bool:
            seen = httpx.get(f"{url}/v1/datasets/{dataset_id}", headers=auth(key)).json()
            return seen["status"] == "building" and seen["progress"] is not None

        assert localstack.wait_until(mid_build, 60, interval_s=0.1)
    finally:
        first.kill()

    second = _ingest(settings, tmp_path, ack_wait_s="4")
    second.start()
    try:
        interrupted = httpx.get(f"{url}/v1/datasets/{dataset_id}", headers=auth(key)).json()
        assert interrupted["status"] == "building"
        assert interrupted["version"] is None  # nothing half-built is visible
        resumed = wait_finished(url, key, dataset_id)
        check_report(resumed, selected=KILLED)
        assert resumed["attempts"] == 2
        uninterrupted = wait_finished(url, key, post(url, key, spec).json()["id"])
        assert uninterrupted["attempts"] == 1
        assert uninterrupted["version"] == resumed["version"]
    finally:
        second.stop()

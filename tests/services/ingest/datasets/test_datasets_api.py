"""POST/GET /v1/datasets on a running ingest service: refusals that name the problem, tenancy,
paging. Builds themselves are in test_datasets_flow.py."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from sqlmodel import Session

from services.ingest.samples.store import insert_samples
from shared import db
from shared.chat import Message, ResponseMeta, Sample
from tests.services.ingest.conftest import Edge


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def store_samples(database_url: str, tenant: str, tag: str, count: int) -> list[Sample]:
    """Samples straight into the service's store, as the persister would have put them."""
    samples = [
        Sample(
            tenant=tenant,
            source="gateway",
            source_ref=f"{tag}-{i}",
            created_at=datetime.now(UTC),
            messages=[
                Message(role="user", content=f"{tag}: what is {i} + {i}?"),
                Message(role="assistant", content=f"{i} + {i} is {2 * i}."),
            ],
            response=ResponseMeta(provider="openai", model="gpt-4o-mini", finish_reason="stop"),
            tags=[tag],
        )
        for i in range(count)
    ]
    engine = db.make_engine(database_url)
    try:
        with Session(engine) as session:
            insert_samples(session, samples)
    finally:
        engine.dispose()
    return samples


def post(url: str, key: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{url}/v1/datasets", json=body, headers=auth(key))


@pytest.fixture(scope="module")
def tag(edge: Edge) -> str:
    name = f"api-{uuid.uuid4().hex[:8]}"
    store_samples(edge.settings.database_url, "acme", name, 12)
    return name


def test_bad_requests_are_refused_naming_the_problem(edge: Edge, tag: str) -> None:
    unknown_field = post(
        edge.url, edge.key, {"name": "d", "source": {"tags": [tag], "modle": ["x"]}}
    )
    assert unknown_field.status_code == 422
    locs = [error["loc"] for error in unknown_field.json()["detail"]]
    assert ["body", "source", "modle"] in locs

    no_input = post(edge.url, edge.key, {"name": "d"})
    assert no_input.status_code == 422
    assert "file_ids" in no_input.text

    unknown_file = post(edge.url, edge.key, {"name": "d", "file_ids": ["file-doesnotexist"]})
    assert unknown_file.status_code == 404
    assert "file_ids[0]" in unknown_file.json()["detail"]
    assert "file-doesnotexist" in unknown_file.json()["detail"]

    empty = post(edge.url, edge.key, {"name": "d", "source": {"tags": ["no-such-tag"]}})
    assert empty.status_code == 422
    assert "empty selection" in empty.json()["detail"]

    too_big = post(
        edge.url, edge.key, {"name": "d", "source": {"tags": [tag]}, "split": {"eval_size": 12}}
    )
    assert too_big.status_code == 422
    assert "split.eval_size" in too_big.json()["detail"]
    assert "12" in too_big.json()["detail"]

    bad_fraction = post(
        edge.url, edge.key, {"name": "d", "source": {"tags": [tag]}, "split": {"eval_size": 1.5}}
    )
    assert bad_fraction.status_code == 422
    assert ["body", "split", "eval_size"] in [e["loc"][:3] for e in bad_fraction.json()["detail"]]

    unauthenticated = httpx.post(f"{edge.url}/v1/datasets", json={"name": "d"})
    assert unauthenticated.status_code == 401


@pytest.mark.parametrize(
    ("base_model", "says"),
    [
        # The service's own disk, e.g. the documented model directory: not the tenant's to read.
        ("/work/main/.tuneloop/models/SmolLM2-135M-Instruct", "local paths are not accepted"),
        ("HuggingFaceTB/SmolLM2-135M-Instruct", "SmolLM2-135M-Instruct"),
        ("gpt2", "neither a catalogue id (SmolLM2-135M-Instruct)"),
        ("s3://tuneloop-test/tenants/globex/models/m/", "outside this tenant's storage"),
        ("s3://another-bucket/tenants/acme/models/m/", "outside this tenant's storage"),
        # In the catalogue, but this service's data dir has no copy yet.
        ("SmolLM2-135M-Instruct", "run `make model`"),
    ],
)
def test_a_base_model_outside_the_catalogue_and_the_tenants_storage_is_refused(
    edge: Edge, tag: str, base_model: str, says: str
) -> None:
    refused = post(
        edge.url, edge.key, {"name": "d", "base_model": base_model, "source": {"tags": [tag]}}
    )
    assert refused.status_code == 422
    assert "base_model" in refused.text
    assert says in refused.text


def test_a_dataset_is_accepted_and_only_its_tenant_sees_it(edge: Edge, tag: str) -> None:
    created = post(edge.url, edge.key, {"name": "mine", "source": {"tags": [tag]}})
    assert created.status_code == 202, created.text
    dataset = created.json()
    assert dataset["id"].startswith("ds_")
    assert dataset["object"] == "dataset"
    assert dataset["status"] == "queued"
    assert dataset["name"] == "mine"
    assert isinstance(dataset["created_at"], int)

    mine = httpx.get(f"{edge.url}/v1/datasets/{dataset['id']}", headers=auth(edge.key))
    assert mine.status_code == 200
    assert mine.json()["id"] == dataset["id"]

    for path in (f"/v1/datasets/{dataset['id']}", f"/v1/datasets/{dataset['id']}/export"):
        theirs = httpx.get(f"{edge.url}{path}", headers=auth(edge.other_key))
        assert theirs.status_code == 404, path
    listed = httpx.get(f"{edge.url}/v1/datasets", headers=auth(edge.other_key)).json()
    assert dataset["id"] not in [d["id"] for d in listed["data"]]
    # The other tenant's filter sees none of acme's samples.
    assert post(edge.url, edge.other_key, {"name": "x", "source": {"tags": [tag]}}).status_code == (
        422
    )


def test_list_pages_newest_first(edge: Edge, tag: str) -> None:
    made = [
        post(edge.url, edge.key, {"name": f"p{i}", "source": {"tags": [tag]}}).json()["id"]
        for i in range(3)
    ]
    first = httpx.get(f"{edge.url}/v1/datasets?limit=2", headers=auth(edge.key)).json()
    assert first["object"] == "list"
    assert first["has_more"] is True
    assert [d["id"] for d in first["data"]] == made[::-1][:2]
    second = httpx.get(
        f"{edge.url}/v1/datasets",
        params={"limit": 2, "after": first["last_id"]},
        headers=auth(edge.key),
    ).json()
    assert second["data"][0]["id"] == made[0]
    bad = httpx.get(f"{edge.url}/v1/datasets?after=ds_nope", headers=auth(edge.key))
    assert bad.status_code == 400
    assert "after" in bad.json()["detail"]

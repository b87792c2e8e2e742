"""Eval sets on a running ingest service (real NATS, S3, SQLite): refusals naming the field,
tenancy, a refresh taking the most recent scrubbed samples as a new version, and eval sets kept
apart from train splits in both directions (a refresh skips what a built dataset trains on; a
build leaves out what an eval set holds, and says so in its report)."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from sqlmodel import Session, select

from services.ingest.datasets.snapshots import read_snapshot
from services.ingest.models import EvalSetItemRow
from services.ingest.samples.store import insert_samples
from shared import db
from shared.chat import Message, ResponseMeta, Sample
from shared.storage import ObjectStore
from tests.plugins.tenants import ADMIN
from tests.services.ingest.conftest import Edge
from tests.services.ingest.datasets.test_datasets_api import auth, post
from tests.services.ingest.datasets.test_datasets_flow import check_report, wait_finished

START = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)


def sample(tag: str, index: int, question: str, answer: str, *, tenant: str = "acme") -> Sample:
    """A captured call `index` minutes after START (so "most recent" is known exactly)."""
    return Sample(
        tenant=tenant,
        source="gateway",
        source_ref=f"{tag}-{index}",
        created_at=START + timedelta(minutes=index),
        messages=[
            Message(role="user", content=question),
            Message(role="assistant", content=answer),
        ],
        response=ResponseMeta(provider="openai", model="gpt-4o-mini", finish_reason="stop"),
        tags=[tag],
    )


def arithmetic(tag: str, count: int, first: int = 0) -> list[Sample]:
    return [
        sample(tag, i, f"{tag}: what is {i} plus {i}?", f"{i} plus {i} is {2 * i}.")
        for i in range(first, first + count)
    ]


def store(edge: Edge, samples: list[Sample]) -> None:
    engine = db.make_engine(edge.settings.database_url)
    try:
        with Session(engine) as session:
            insert_samples(session, samples)
    finally:
        engine.dispose()


def create(edge: Edge, body: dict[str, Any], key: str | None = None) -> httpx.Response:
    return httpx.post(f"{edge.url}/v1/eval_sets", json=body, headers=auth(key or edge.key))


def refresh(edge: Edge, eval_set_id: str, key: str | None = None) -> httpx.Response:
    return httpx.post(
        f"{edge.url}/v1/eval_sets/{eval_set_id}/refresh", headers=auth(key or edge.key), timeout=60
    )


def content(edge: Edge, eval_set_id: str, version: str = "latest") -> list[dict[str, Any]]:
    answer = httpx.get(
        f"{edge.url}/v1/eval_sets/{eval_set_id}/versions/{version}/content", headers=auth(edge.key)
    )
    assert answer.status_code == 200, answer.text
    return [json.loads(line) for line in answer.text.splitlines()]


def questions(lines: list[dict[str, Any]]) -> list[str]:
    return [line["messages"][0]["content"] for line in lines]


def held_ids(edge: Edge, eval_set_id: str) -> set[str]:
    """The sample ids an eval set's versions hold, from the table builds compare with (the API
    shows content, without ids)."""
    engine = db.make_engine(edge.settings.database_url)
    try:
        with Session(engine) as session:
            statement = select(EvalSetItemRow.sample_id).where(
                EvalSetItemRow.eval_set_id == eval_set_id
            )
            return set(session.exec(statement))
    finally:
        engine.dispose()


@pytest.fixture(scope="module")
def read_key(edge: Edge) -> str:
    answer = httpx.post(
        f"{edge.url}/v1/admin/tenants/acme/api_keys",
        json={"name": "eval sets reader", "scope": "read"},
        headers=ADMIN,
    )
    assert answer.status_code == 201, answer.text
    return str(answer.json()["key"])


def test_bad_input_is_refused_naming_the_field_and_other_tenants_see_nothing(
    edge: Edge, read_key: str
) -> None:
    tag = f"evs-bad-{uuid.uuid4().hex[:8]}"
    store(edge, arithmetic(tag, 3))
    refusals: list[tuple[dict[str, Any], list[str]]] = [
        ({"name": "e"}, ["body", "source"]),
        ({"name": "e", "source": {"tags": [tag]}, "size": 0}, ["body", "size"]),
        ({"name": "e", "source": {"tags": [tag]}, "size": 1001}, ["body", "size"]),
        ({"name": "e", "source": {"tags": [tag], "modle": ["x"]}}, ["body", "source", "modle"]),
        ({"name": "e", "source": {"tags": [tag]}, "metadata": {"k": 1}}, ["body", "metadata", "k"]),
        (
            {"name": "e", "source": {"tags": [tag]}, "metadata": {f"k{i}": "v" for i in range(17)}},
            ["body", "metadata"],
        ),
    ]
    for body, loc in refusals:
        refused = create(edge, body)
        assert refused.status_code == 422, (body, refused.text)
        assert loc in [error["loc"] for error in refused.json()["detail"]], refused.text

    assert create(edge, {"name": "e", "source": {"tags": [tag]}}, key=read_key).status_code == 403
    created = create(edge, {"name": "mine", "source": {"tags": [tag]}, "metadata": {"team": "qa"}})
    assert created.status_code == 201, created.text
    eval_set = created.json()
    assert eval_set["id"].startswith("evs_")
    assert (eval_set["object"], eval_set["size"], eval_set["latest_version"]) == (
        "eval_set",
        200,
        None,
    )
    assert eval_set["metadata"] == {"team": "qa"}
    base = f"{edge.url}/v1/eval_sets/{eval_set['id']}"
    no_version = httpx.get(f"{base}/versions/latest/content", headers=auth(edge.key))
    assert no_version.status_code == 404
    assert "no version yet" in no_version.json()["detail"]
    assert refresh(edge, eval_set["id"], key=read_key).status_code == 403
    assert refresh(edge, eval_set["id"]).status_code == 201

    bad_version = httpx.get(f"{base}/versions/first", headers=auth(edge.key))
    assert bad_version.status_code == 422
    assert ["path", "version"] in [error["loc"] for error in bad_version.json()["detail"]]
    missing = httpx.get(f"{base}/versions/7", headers=auth(edge.key))
    assert missing.status_code == 404
    assert "version 7" in missing.json()["detail"]
    # A read key reads.
    assert httpx.get(f"{base}/versions/1/content", headers=auth(read_key)).status_code == 200

    for path in ("", "/versions", "/versions/1", "/versions/latest/content"):
        theirs = httpx.get(f"{base}{path}", headers=auth(edge.other_key))
        assert theirs.status_code == 404, path
    assert refresh(edge, eval_set["id"], key=edge.other_key).status_code == 404
    listed = httpx.get(f"{edge.url}/v1/eval_sets", headers=auth(edge.other_key)).json()
    assert eval_set["id"] not in [item["id"] for item in listed["data"]]
    mine = httpx.get(f"{edge.url}/v1/eval_sets", headers=auth(edge.key)).json()
    assert eval_set["id"] in [item["id"] for item in mine["data"]]

    # The other tenant's filter never reaches acme's samples: nothing to hold.
    theirs = create(edge, {"name": "e", "source": {"tags": [tag]}}, key=edge.other_key).json()
    empty = refresh(edge, theirs["id"], key=edge.other_key)
    assert empty.status_code == 422
    assert empty.json()["detail"].startswith("source: empty selection")


def test_a_refresh_holds_the_most_recent_scrubbed_samples_as_a_new_version(edge: Edge) -> None:
    tag = f"evs-fresh-{uuid.uuid4().hex[:8]}"
    older = arithmetic(tag, 4)  # minutes 0-3
    newer = [
        sample(tag, 4, f"{tag}: what is 3 plus 3?", "Six."),  # asks minute 3's question again
        sample(tag, 5, f"{tag}: write to me", "Sure: ann@example.com is my address."),
        sample(tag, 6, f"{tag}: help me hack", "I'm sorry, but I can't help with that."),
        sample(tag, 7, f"{tag}: what is 9 plus 9?", "18."),
    ]
    store(edge, older + newer)
    eval_set = create(edge, {"name": "fresh", "source": {"tags": [tag]}, "size": 4}).json()

    first = refresh(edge, eval_set["id"])
    assert first.status_code == 201, first.text
    version = first.json()
    assert (version["object"], version["version"], version["item_count"]) == (
        "eval_set.version",
        1,
        4,
    )
    # Newest first: 7; 6 a refusal (removed by the flags step); 5 with its email scrubbed; 4;
    # 3 asks 4's question; 2 fills the set; 1 and 0 were read in the same batch, beyond the size.
    assert version["report"]["removed"] == {"flags": 1, "same_prompt": 1}
    assert version["report"]["beyond_size"] == 2
    assert version["report"]["scanned"] == 8
    assert version["report"]["pii"] == {"email": 1}
    assert version["report"]["new_items"] == 4
    assert version["report"]["oldest_sample_at"] == int((START + timedelta(minutes=2)).timestamp())
    lines = content(edge, eval_set["id"])
    assert questions(lines) == [
        f"{tag}: what is 2 plus 2?",
        f"{tag}: what is 3 plus 3?",
        f"{tag}: write to me",
        f"{tag}: what is 9 plus 9?",
    ]
    assert lines[1]["messages"][1]["content"] == "Six."  # the newer answer of the two
    assert lines[2]["messages"][1]["content"] == "Sure: [EMAIL] is my address."

    store(edge, [sample(tag, 8, f"{tag}: what is 8 plus 8?", "16.")])
    second = refresh(edge, eval_set["id"]).json()
    assert (second["version"], second["item_count"], second["report"]["new_items"]) == (2, 4, 1)
    assert questions(content(edge, eval_set["id"]))[-1] == f"{tag}: what is 8 plus 8?"
    assert f"{tag}: what is 2 plus 2?" not in questions(content(edge, eval_set["id"]))
    # Version 1 is as it was.
    assert questions(content(edge, eval_set["id"], "1")) == questions(lines)
    versions = httpx.get(
        f"{edge.url}/v1/eval_sets/{eval_set['id']}/versions", headers=auth(edge.key)
    ).json()
    assert [v["version"] for v in versions["data"]] == [2, 1]
    again = httpx.get(f"{edge.url}/v1/eval_sets/{eval_set['id']}", headers=auth(edge.key)).json()
    assert again["latest_version"] == 2


def test_eval_sets_and_train_splits_are_kept_apart(edge: Edge) -> None:
    s3 = ObjectStore.from_settings(edge.settings.s3)
    # A dataset built first: a refresh must skip its train split, by id and by prompt.
    trained_tag = f"evs-trained-{uuid.uuid4().hex[:8]}"
    trained = arithmetic(trained_tag, 10)
    store(edge, trained)
    dataset = post(
        edge.url,
        edge.key,
        {"name": "trained", "source": {"tags": [trained_tag]}, "split": {"eval_size": 3}},
    ).json()
    built = wait_finished(edge.url, edge.key, dataset["id"])
    check_report(built, selected=10)
    train, evaluation, _ = read_snapshot(s3, built["uri"])
    train_ids = {s.id for s in train}
    # The same question as a trained sample, captured again under another id.
    copied = next(s for s in trained if s.id in train_ids)
    again = sample(trained_tag, 20, copied.messages[0].text(), copied.messages[1].text())
    store(edge, [again])
    assert again.id not in train_ids

    eval_set = create(edge, {"name": "after", "source": {"tags": [trained_tag]}}).json()
    version = refresh(edge, eval_set["id"]).json()
    # What the build did not train on (its eval split, anything cleaning removed) is held.
    assert held_ids(edge, eval_set["id"]) == {s.id for s in trained} - train_ids
    assert {s.id for s in evaluation} <= held_ids(edge, eval_set["id"])
    assert version["report"]["removed"] == {"in_train": len(train) + 1}
    assert version["report"]["train_datasets"] >= 1

    # An eval set first: every later build leaves what it holds out of train.
    held_tag = f"evs-held-{uuid.uuid4().hex[:8]}"
    captured = arithmetic(held_tag, 8)
    store(edge, captured)
    holder = create(edge, {"name": "holder", "source": {"tags": [held_tag]}, "size": 3}).json()
    assert refresh(edge, holder["id"]).status_code == 201
    held = held_ids(edge, holder["id"])
    assert held == {s.id for s in captured[-3:]}
    asked_again = next(s for s in captured if s.id in held)
    repeat = sample(held_tag, 30, asked_again.messages[0].text(), "Asked once more.")
    store(edge, [repeat])

    dataset = post(
        edge.url,
        edge.key,
        {"name": "later", "source": {"tags": [held_tag]}, "split": {"eval_size": 1}},
    ).json()
    built = wait_finished(edge.url, edge.key, dataset["id"])
    check_report(built, selected=9)
    holdout = built["report"]["steps"][0]
    assert (holdout["step"], holdout["removed"], holdout["reasons"]) == (
        "eval_holdout",
        4,
        {"eval_set": 4},
    )
    assert [step["step"] for step in built["progress"]["steps"]][:2] == ["select", "eval_holdout"]
    train, evaluation, _ = read_snapshot(s3, built["uri"])
    assert (len(train), len(evaluation)) == (4, 1)
    built_ids = {s.id for s in [*train, *evaluation]}
    assert not built_ids & (held | {repeat.id})

"""GET /v1/samples through the running service: every filter, keyset pagination that neither
skips nor repeats a sample (ties on created_at included), a bad cursor named, tenants apart.
The rows are put in the service's database directly, as the persister would store them."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from services.ingest.samples.store import insert_samples
from shared.chat import Sample
from shared.db import make_engine, session_scope
from tests.services.ingest.conftest import Edge

T0 = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)


def _sample(tag: str, n: int, **response: Any) -> Sample:
    """Sample `n`: made n minutes after T0 (samples 4-6 all at the same minute, so pages
    must break ties by id), a distinct source_ref, tagged `tag` and `odd`/`even`."""
    minutes = 4 if 4 <= n <= 6 else n
    meta = {"provider": "openai", "model": "gpt-4o-mini"} | response
    if meta.get("status") == "error":
        meta["error"] = {"status_code": 429, "message": "rate limited"}
    return Sample.model_validate(
        {
            "tenant": "acme",
            "source": "gateway" if n % 3 else "upload",
            "source_ref": f"{tag}-{n}",
            "created_at": T0 + timedelta(minutes=minutes),
            "messages": [
                {"role": "user", "content": f"question {n}"},
                {"role": "assistant", "content": f"answer {n}"},
            ],
            "response": meta,
            "tags": [tag, "odd" if n % 2 else "even"],
        }
    )


@pytest.fixture(scope="module")
def stored(edge: Edge) -> tuple[str, list[Sample]]:
    tag = f"listing-{uuid.uuid4().hex[:8]}"
    samples = [_sample(tag, n) for n in range(10)]
    samples.append(_sample(tag, 10, provider="anthropic", model="claude-3-5-haiku"))
    samples.append(_sample(tag, 11, status="error"))
    engine = make_engine(edge.settings.database_url)
    try:
        with session_scope(engine) as session:
            insert_samples(session, samples)
            session.commit()
    finally:
        engine.dispose()
    return tag, samples


def _get(edge: Edge, key: str | None = None, **params: Any) -> httpx.Response:
    return httpx.get(
        f"{edge.url}/v1/samples",
        params=params,
        headers={"Authorization": f"Bearer {key or edge.key}"},
    )


def _ids(samples: list[Sample]) -> list[str]:
    """Newest first, ties by id descending: the order the API pages in."""
    ordered = sorted(samples, key=lambda s: (s.created_at, s.id), reverse=True)
    return [s.id for s in ordered]


def test_pages_walk_every_sample_once_newest_first(
    edge: Edge, stored: tuple[str, list[Sample]]
) -> None:
    tag, samples = stored
    seen: list[str] = []
    params: dict[str, Any] = {"tag": tag, "limit": 2}
    pages = 0
    while True:
        page = _get(edge, **params).json()
        pages += 1
        seen += [item["id"] for item in page["data"]]
        if not page["has_more"]:
            assert page["next_cursor"] is None
            break
        assert len(page["data"]) == 2
        params["cursor"] = page["next_cursor"]
    assert seen == _ids(samples)  # in order, none skipped or repeated across the tie
    assert pages == 6
    whole = _get(edge, tag=tag, limit=1000).json()
    assert [item["id"] for item in whole["data"]] == seen
    assert whole["data"][0]["messages"][0]["content"] == [{"type": "text", "text": "question 11"}]


@pytest.mark.parametrize(
    ("params", "wanted"),
    [
        ({"since": (T0 + timedelta(minutes=8)).isoformat()}, lambda s: s.created_at >= T0 + timedelta(minutes=8)),
        ({"until": (T0 + timedelta(minutes=4)).isoformat()}, lambda s: s.created_at < T0 + timedelta(minutes=4)),
        ({"source": "upload"}, lambda s: s.source == "upload"),
        ({"provider": "anthropic"}, lambda s: s.response.provider == "anthropic"),
        ({"model": "claude-3-5-haiku"}, lambda s: s.response.model == "claude-3-5-haiku"),
        ({"status": "error"}, lambda s: s.response.status == "error"),
        ({"status": "ok", "source": "gateway"}, lambda s: s.response.status == "ok" and s.source == "gateway"),
        ({"tag": "odd"}, lambda s: "odd" in s.tags),  # tags repeat: every one must match
    ],
)  # fmt: skip
def test_each_filter_narrows_the_list(
    edge: Edge, stored: tuple[str, list[Sample]], params: dict[str, str], wanted: Any
) -> None:
    tag, samples = stored
    other = {name: value for name, value in params.items() if name != "tag"}
    tags = [tag, *([params["tag"]] if "tag" in params else [])]
    response = _get(edge, tag=tags, limit=1000, **other)
    assert response.status_code == 200, response.text
    expected = _ids([s for s in samples if wanted(s)])
    assert expected  # each case selects something, and not everything
    assert len(expected) < len(samples)
    assert [item["id"] for item in response.json()["data"]] == expected


def test_bad_queries_are_named_and_other_tenants_see_nothing(
    edge: Edge, stored: tuple[str, list[Sample]]
) -> None:
    tag, _ = stored
    bad_cursor = _get(edge, tag=tag, cursor="bm90IGEgY3Vyc29y")
    assert bad_cursor.status_code == 400
    assert bad_cursor.json()["detail"].startswith("cursor:")
    for params, field in [({"limit": 0}, "limit"), ({"status": "maybe"}, "status"),
                          ({"since": "yesterday"}, "since"), ({"colour": "red"}, "colour")]:  # fmt: skip
        response = _get(edge, tag=tag, **params)
        assert response.status_code == 422, params
        assert field in str(response.json()["detail"]), params
    assert _get(edge, edge.other_key, tag=tag).json() == {
        "object": "list", "data": [], "next_cursor": None, "has_more": False
    }  # fmt: skip

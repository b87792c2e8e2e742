"""Feedback end to end, through a real ingest process (real NATS, S3, SQLite) and the official
SDKs: every captured answer names the sample it becomes (`x-tuneloop-sample-id`), feedback on
that id is stored and listed per tenant (`/v1/feedback`), and datasets select by it."""

from __future__ import annotations

import json
import uuid
from typing import Any

import anthropic
import httpx
import openai
from google import genai
from google.genai import types

from tests.fakes.upstream import recorded
from tests.plugins.tenants import ADMIN
from tests.services.ingest.conftest import Edge
from tests.services.ingest.datasets.test_datasets_api import auth, post
from tests.services.ingest.datasets.test_datasets_flow import export, wait_finished

HEADER = "x-tuneloop-sample-id"


def _tag(name: str) -> dict[str, str]:
    return {"x-tuneloop-tags": name}


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _stored_id(edge: Edge, tag: str) -> str:
    [sample] = edge.wait_for_samples(1, tag=tag)
    return str(sample["id"])


def _only(headers: httpx.Headers) -> str:
    [value] = headers.get_list(HEADER)
    return value


def test_openai_answers_name_their_stored_sample_plain_and_streamed(edge: Edge) -> None:
    client = openai.OpenAI(base_url=f"{edge.url}/v1", api_key=edge.key, max_retries=0)
    plain_tag, stream_tag = _unique("oa-plain"), _unique("oa-stream")
    request = recorded("oa01_tool_calls_multiturn")["request"]["body"]
    plain = client.chat.completions.with_raw_response.create(
        **request, extra_headers=_tag(plain_tag)
    )
    assert plain.parse().choices[0].message.tool_calls
    streamed_request = recorded("oa03_streaming_parallel_tool_calls_sse")["request"]["body"]
    assert streamed_request["stream"] is True
    streamed = client.chat.completions.with_raw_response.create(
        **streamed_request, extra_headers=_tag(stream_tag)
    )
    assert list(streamed.parse())  # the header came before the first chunk

    plain_id, stream_id = _only(plain.headers), _only(streamed.headers)
    assert plain_id != stream_id
    assert plain_id == _stored_id(edge, plain_tag)
    assert stream_id == _stored_id(edge, stream_tag)


def test_anthropic_and_gemini_answers_name_their_stored_sample(edge: Edge) -> None:
    client = anthropic.Anthropic(base_url=edge.url, api_key=edge.key, max_retries=0)
    plain_tag, stream_tag, gemini_tag = _unique("an-plain"), _unique("an-stream"), _unique("ge")
    request = recorded("an03_parallel_tool_use_gzip")["request"]["body"]
    plain = client.messages.with_raw_response.create(**request, extra_headers=_tag(plain_tag))
    assert plain.parse().stop_reason == "tool_use"
    streamed_request = recorded("an08_streaming_tool_use_input_json_delta_sse")["request"]["body"]
    streamed = client.messages.with_raw_response.create(
        **{**streamed_request, "stream": True}, extra_headers=_tag(stream_tag)
    )
    assert list(streamed.parse())

    options = types.HttpOptions(base_url=edge.url, headers=_tag(gemini_tag))
    gemini = genai.Client(api_key=edge.key, http_options=options)
    answer = gemini.models.generate_content(model="gemini-2.0-flash", contents="Weather in Rome?")
    assert answer.sdk_http_response is not None
    gemini_headers = {k.lower(): v for k, v in (answer.sdk_http_response.headers or {}).items()}

    assert _only(plain.headers) == _stored_id(edge, plain_tag)
    assert _only(streamed.headers) == _stored_id(edge, stream_tag)
    assert gemini_headers[HEADER] == _stored_id(edge, gemini_tag)


def test_only_captured_calls_name_a_sample(edge: Edge) -> None:
    client = openai.OpenAI(base_url=f"{edge.url}/v1", api_key=edge.key, max_retries=0)
    request = recorded("oa01_tool_calls_multiturn")["request"]["body"]
    captured = client.chat.completions.with_raw_response.create(**request)
    assert _only(captured.headers)
    # Relayed, not captured (embeddings, token counts), and refused calls: no sample, no id.
    relayed = client.embeddings.with_raw_response.create(
        model="text-embedding-3-small", input="not a conversation"
    )
    assert relayed.http_response.status_code == 200
    assert HEADER not in relayed.headers
    counted = httpx.post(
        f"{edge.url}/v1beta/models/gemini-2.0-flash:countTokens",
        json={"contents": [{"parts": [{"text": "hi"}]}]},
        headers={"x-goog-api-key": edge.key},
    )
    assert counted.status_code == 200
    assert HEADER not in counted.headers
    refused = httpx.post(
        f"{edge.url}/v1/chat/completions",
        json={"model": "nobody-serves-this", "messages": [{"role": "user", "content": "hi"}]},
        headers=auth(edge.key),
    )
    assert refused.status_code == 404
    assert HEADER not in refused.headers


def _feedback(edge: Edge, body: Any, key: str | None = None) -> httpx.Response:
    """`body` as JSON, or bytes as they are (JSON with NaN, which httpx would not write)."""
    headers = auth(key or edge.key) | {"content-type": "application/json"}
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(f"{edge.url}/v1/feedback", content=content, headers=headers)


def _listed(edge: Edge, sample_id: str, key: str | None = None) -> list[dict[str, Any]]:
    response = httpx.get(
        f"{edge.url}/v1/feedback", params={"sample_id": sample_id}, headers=auth(key or edge.key)
    )
    assert response.status_code == 200, response.text
    data: list[dict[str, Any]] = response.json()["data"]
    return data


def test_feedback_is_stored_listed_newest_first_and_kept_to_its_tenant(edge: Edge) -> None:
    sample_id = str(uuid.uuid4())  # not stored (yet): accepted all the same
    created = _feedback(
        edge, {"sample_id": sample_id, "score": 0.9, "label": "good", "comment": "Spot on.\nTa"}
    )
    assert created.status_code == 201, created.text
    first = created.json()
    assert first["id"].startswith("fb_")
    assert {k: v for k, v in first.items() if k not in ("id", "created_at")} == {
        "object": "feedback",
        "sample_id": sample_id,
        "score": 0.9,
        "label": "good",
        "comment": "Spot on.\nTa",
    }
    assert isinstance(first["created_at"], int)
    second = _feedback(edge, {"sample_id": sample_id, "label": "bad"})
    assert second.status_code == 201, second.text
    assert second.json()["score"] is None
    assert [f["id"] for f in _listed(edge, sample_id)] == [second.json()["id"], first["id"]]

    # Another tenant neither sees acme's feedback nor adds to it; its own is its own.
    assert _listed(edge, sample_id, edge.other_key) == []
    theirs = _feedback(edge, {"sample_id": sample_id, "label": "good"}, edge.other_key)
    assert theirs.status_code == 201
    assert len(_listed(edge, sample_id)) == 2
    assert [f["id"] for f in _listed(edge, sample_id, edge.other_key)] == [theirs.json()["id"]]

    # A read key reads and does not write; no key is a 401.
    issued = httpx.post(
        f"{edge.url}/v1/admin/tenants/acme/api_keys",
        json={"name": "reader", "scope": "read"},
        headers=ADMIN,
    )
    read_key = issued.json()["key"]
    assert len(_listed(edge, sample_id, read_key)) == 2
    assert _feedback(edge, {"sample_id": sample_id, "label": "x"}, read_key).status_code == 403
    anonymous = httpx.post(f"{edge.url}/v1/feedback", json={"sample_id": "s", "label": "x"})
    assert anonymous.status_code == 401


def test_bad_feedback_is_a_422_naming_the_field(edge: Edge) -> None:
    cases: list[tuple[Any, str]] = [
        ({"label": "good"}, "sample_id"),
        ({"sample_id": "", "label": "good"}, "sample_id"),
        ({"sample_id": "s" * 65, "label": "good"}, "sample_id"),
        ({"sample_id": "s", "comment": "no verdict"}, "score / label"),
        ({"sample_id": "s", "score": "0.9"}, "score"),
        ({"sample_id": "s", "score": True}, "score"),
        (b'{"sample_id": "s", "score": NaN}', "score"),
        (b'{"sample_id": "s", "score": 1e999}', "score"),
        ({"sample_id": "s", "label": "so so"}, "label"),
        ({"sample_id": "s", "label": "x" * 65}, "label"),
        ({"sample_id": "s", "label": "ok", "comment": "c" * 2001}, "comment"),
        ({"sample_id": "s", "label": "ok", "comment": "nul \x00 byte"}, "comment"),
        (b'{"sample_id": "s", "label": "ok", "comment": "lone \\ud800"}', "comment"),
        ({"sample_id": "s", "label": "ok", "lable": "good"}, "lable"),
        (["not", "an", "object"], "body"),
    ]
    for body, field in cases:
        refused = _feedback(edge, body)
        assert refused.status_code == 422, (body, refused.text)
        assert field in refused.text, (body, refused.text)
    missing = httpx.get(f"{edge.url}/v1/feedback", headers=auth(edge.key))
    assert missing.status_code == 422
    assert "sample_id" in missing.text
    assert _listed(edge, "s") == []  # nothing refused was stored


def test_datasets_select_by_the_newest_feedback_label_and_score(edge: Edge) -> None:
    tag = _unique("feedback")
    prompts = [f"{tag}: question number {i}, about something else entirely" for i in range(6)]
    client = openai.OpenAI(base_url=f"{edge.url}/v1", api_key=edge.key, max_retries=0)
    request = recorded("oa01_tool_calls_multiturn")["request"]["body"]
    ids = []
    for prompt in prompts:
        answer = client.chat.completions.with_raw_response.create(
            **{**request, "messages": [{"role": "user", "content": prompt}]},
            extra_headers=_tag(tag),
        )
        ids.append(_only(answer.headers))
    given = [
        (0, {"label": "good", "score": 0.8}),
        (1, {"label": "good"}),
        (1, {"label": "bad"}),  # newest wins: bad
        (2, {"label": "bad", "score": 0.3}),
        (2, {"label": "good"}),  # good now, its score still 0.3
        (3, {"score": 0.9}),
    ]
    for index, verdict in given:  # before the samples are stored, as a quick client may
        assert _feedback(edge, {"sample_id": ids[index], **verdict}).status_code == 201
    # Another tenant's verdicts on acme's ids change nothing for acme.
    for sample_id in ids:
        assert _feedback(edge, {"sample_id": sample_id, "label": "good", "score": 1.0},
                         edge.other_key).status_code == 201  # fmt: skip
    assert sorted(s["id"] for s in edge.wait_for_samples(len(prompts), tag=tag)) == sorted(ids)

    keep_all = {"near_dup_threshold": None, "decontaminate_ngram": None}
    by_label = {
        "name": "liked",
        "source": {"tags": [tag], "feedback_label": "good"},
        "cleaning": keep_all,
        "split": {"eval_size": 1},
    }
    by_score = {
        "name": "scored",
        "source": {"tags": [tag]},
        "cleaning": keep_all | {"min_score": 0.5},
        "split": {"eval_size": 1},
    }
    assert _built_prompts(edge, by_label) == {prompts[0], prompts[2]}
    assert _built_prompts(edge, by_score) == {prompts[0], prompts[3]}

    nobody = post(edge.url, edge.key, by_label | {"source": {"tags": [tag], "feedback_label": "x"}})
    assert nobody.status_code == 422
    assert "empty selection" in nobody.text


def _built_prompts(edge: Edge, spec: dict[str, Any]) -> set[str]:
    created = post(edge.url, edge.key, spec)
    assert created.status_code == 202, created.text
    built = wait_finished(edge.url, edge.key, created.json()["id"])
    assert built["status"] == "built", built["error"]
    lines = export(edge, built["id"], "train") + export(edge, built["id"], "eval")
    return {line["messages"][0]["content"] for line in lines}

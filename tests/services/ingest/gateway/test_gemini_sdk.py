"""The official Gemini SDK (google-genai) pointed at the gateway, as it comes: it calls
`/v1/models/{model}:generateContent` (API version v1 by default) and `:streamGenerateContent?alt=sse`.
Through a real ingest process to the fake upstream; samples over real NATS and S3. The rest of
/v1/models stays the hoster's, ft: ids with their colons included."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from google import genai
from google.genai import errors, types

from tests.fakes.raw_http import RawRecorder
from tests.fakes.upstream import UPSTREAM_KEYS, recorded
from tests.services.ingest.conftest import Edge

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 2
WEATHER = "What's the weather like in San Francisco?"


def _client(edge: Edge, tag: str, api_version: str | None = None) -> genai.Client:
    options = types.HttpOptions(base_url=edge.url, headers={"x-tuneloop-tags": tag})
    if api_version is not None:
        options.api_version = api_version
    return genai.Client(api_key=edge.key, http_options=options)


def _keys_swapped(edge: Edge, headers: dict[str, str]) -> None:
    assert headers["x-goog-api-key"] == UPSTREAM_KEYS["gemini"]
    assert edge.key not in json.dumps(headers)


def _comparable(sample: dict[str, Any]) -> dict[str, Any]:
    """A sample less what differs between two captures of the same call."""
    response = {k: v for k, v in sample["response"].items() if "ms" not in k}
    kept = {k: v for k, v in sample.items() if k not in ("id", "tags", "created_at", "source_ref")}
    return kept | {"response": response}


def test_generate_content_on_the_sdks_default_api_version_is_proxied_and_captured(
    edge: Edge,
) -> None:
    client = _client(edge, "genai-v1")
    answer = client.models.generate_content(model="gemini-2.0-flash", contents=WEATHER)
    [call] = answer.function_calls or []
    assert (call.name, call.args) == ("get_weather", {"location": "San Francisco"})
    seen = edge.upstream.received[-1]
    assert seen.target == b"/v1/models/gemini-2.0-flash:generateContent"
    assert seen.body["contents"] == [{"parts": [{"text": WEATHER}], "role": "user"}]
    _keys_swapped(edge, seen.headers)

    # The same call on v1beta (the SDK's other version) makes the same sample.
    beta = _client(edge, "genai-v1beta", "v1beta")  # held: a client closes when collected
    beta.models.generate_content(model="gemini-2.0-flash", contents=WEATHER)
    assert edge.upstream.received[-1].target == b"/v1beta/models/gemini-2.0-flash:generateContent"
    [v1] = edge.wait_for_samples(1, tag="genai-v1")
    [v1beta] = edge.wait_for_samples(1, tag="genai-v1beta")
    assert v1["response"]["provider"] == "gemini"
    assert v1["response"]["model_requested"] == "gemini-2.0-flash"
    assert [c["name"] for c in v1["messages"][-1]["tool_calls"]] == ["get_weather"]
    assert _comparable(v1) == _comparable(v1beta)
    assert edge.key not in json.dumps(v1)


def test_generate_content_stream_relays_the_sse_and_captures_the_whole_answer(edge: Edge) -> None:
    client = _client(edge, "genai-stream")
    chunks = list(
        client.models.generate_content_stream(model="gemini-2.5-flash", contents="Describe Image.")
    )
    text = "".join(chunk.text or "" for chunk in chunks)
    events = recorded("ge04_genai_inlineData_urlsafe_b64_sse")["response"]["body"].split("\r\n\r\n")
    expected = "".join(
        part.get("text", "")
        for event in events
        if event.startswith("data: ")
        for candidate in json.loads(event.removeprefix("data: "))["candidates"]
        for part in candidate["content"]["parts"]
    )
    assert len(chunks) > 1
    assert text == expected
    seen = edge.upstream.received[-1]
    assert seen.target == b"/v1/models/gemini-2.5-flash:streamGenerateContent?alt=sse"
    _keys_swapped(edge, seen.headers)

    [sample] = edge.wait_for_samples(1, tag="genai-stream")
    assert sample["messages"][-1]["content"][0]["text"] == text
    assert sample["response"]["time_to_first_token_ms"] is not None


def test_an_inline_image_goes_upstream_unchanged_and_is_stored_in_s3(edge: Edge) -> None:
    client = _client(edge, "genai-image")
    image = types.Part.from_bytes(data=PNG, mime_type="image/png")
    client.models.generate_content(model="gemini-2.0-flash", contents=[image, "What is this?"])
    seen = edge.upstream.received[-1]
    [sent] = [part for part in seen.body["contents"][0]["parts"] if "inlineData" in part]
    assert base64.urlsafe_b64decode(sent["inlineData"]["data"]) == PNG
    _keys_swapped(edge, seen.headers)

    [sample] = edge.wait_for_samples(1, tag="genai-image")
    [stored] = [
        part
        for message in sample["messages"]
        for part in message["content"]
        if part["type"] == "image"
    ]
    assert stored["ref"].startswith("s3://")
    assert "/tenants/acme/media/" in stored["ref"]
    assert "data" not in stored


def test_the_sdks_errors_come_in_geminis_shape(edge: Edge) -> None:
    client = _client(edge, "genai-refused")
    with pytest.raises(errors.ClientError) as unknown:
        client.models.generate_content(model="nobody-knows", contents="x")
    assert unknown.value.code == 404
    # Gemini's message names the API version and method the caller used.
    assert "API version v1, or is not supported for generateContent" in str(unknown.value.message)
    beta = _client(edge, "genai-refused", api_version="v1beta")
    with pytest.raises(errors.ClientError) as unknown_beta:
        next(iter(beta.models.generate_content_stream(model="nobody-knows", contents="x")))
    message = str(unknown_beta.value.message)
    assert "models/nobody-knows is not found for API version v1beta," in message
    assert message.endswith("not supported for streamGenerateContent.")
    bad_key = genai.Client(api_key="tl-wrong", http_options=types.HttpOptions(base_url=edge.url))
    with pytest.raises(errors.ClientError) as refused:
        bad_key.models.generate_content(model="gemini-2.0-flash", contents="x")
    assert refused.value.code == 401


def test_token_counts_and_embeddings_on_v1_are_relayed_not_captured(edge: Edge) -> None:
    client = _client(edge, "genai-relayed")
    assert client.models.count_tokens(model="gemini-2.0-flash", contents="Hi").total_tokens == 31
    assert edge.upstream.received[-1].target == b"/v1/models/gemini-2.0-flash:countTokens"
    _keys_swapped(edge, edge.upstream.received[-1].headers)


@pytest.fixture
def hoster(edge: Edge) -> Iterator[RawRecorder]:
    settings = edge.settings
    with RawRecorder(settings.app.bind_host, settings.services.port_of("hoster")) as recorder:
        yield recorder


def test_the_rest_of_v1_models_goes_to_the_hoster_ft_ids_with_colons_included(
    edge: Edge, hoster: RawRecorder
) -> None:
    headers = {"Authorization": f"Bearer {edge.key}"}
    before = len(edge.upstream.received)
    paths = [
        ("GET", "/v1/models/ft:SmolLM2-135M-Instruct:acme:job-1"),
        ("DELETE", "/v1/models/ft:SmolLM2-135M-Instruct:acme:job-1"),
        ("POST", "/v1/models/ft:SmolLM2-135M-Instruct:acme:job-1"),
        ("POST", "/v1/models/ft:SmolLM2-135M-Instruct:acme:job-1:promote"),
        ("POST", "/v1/models/gemini-2.0-flash:generateContentX"),  # not one of Gemini's actions
        ("GET", "/v1/models/gemini-2.0-flash:generateContent"),  # Gemini's are POSTs
        ("GET", "/v1/models"),
    ]
    for method, path in paths:
        answer = httpx.request(method, edge.url + path, headers=headers, json={})
        assert answer.json()["id"] == "recorded", (method, path, answer.text)
    assert [seen.request_line for seen in hoster.received] == [
        f"{method} {path} HTTP/1.1".encode() for method, path in paths
    ]
    assert edge.upstream.received[before:] == []  # none went to the Gemini upstream

"""The gateway end to end: official SDKs -> a real ingest process -> a fake upstream speaking the
providers' recorded bytes; captured samples travel over real NATS (JetStream) to the persister,
with images in real S3, and come back from GET /v1/samples."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
from pathlib import Path
from typing import Any

import anthropic
import httpx
import nats
import openai
import orjson
import psutil
import pytest
from google.rpc.error_details_pb2 import BadRequest
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from services.ingest.config import IngestSettings
from services.ingest.otlp.workers import map_export
from shared import bus
from shared.chat import Sample
from shared.dev import localstack
from shared.events import SAMPLES, DeploymentReady, DeploymentStopped, Event, SampleCaptured
from shared.settings import Settings
from shared.storage import ObjectStore
from tests.benchmarks.otlp_traces import TraceFactory, export_bodies, to_json, to_protobuf
from tests.fakes.upstream import ENGINE_ANSWER, recorded
from tests.plugins.infra import RunningProcess
from tests.plugins.tenants import ADMIN
from tests.services.ingest.conftest import Edge


def test_openai_sdk_through_the_gateway_gets_the_providers_answer_and_is_captured(
    edge: Edge,
) -> None:
    client = openai.OpenAI(base_url=f"{edge.url}/v1", api_key=edge.key, max_retries=0)
    request = recorded("oa01_tool_calls_multiturn")["request"]["body"]
    completion = client.chat.completions.with_raw_response.create(
        **request, extra_headers={"x-tuneloop-tags": "support, eu"}
    )
    parsed = completion.parse()
    expected = recorded("oa01_tool_calls_multiturn")["response"]["body"]
    assert parsed.id == expected["id"]
    assert [c.function.arguments for c in parsed.choices[0].message.tool_calls] == [
        c["function"]["arguments"] for c in expected["choices"][0]["message"]["tool_calls"]
    ]
    seen = edge.upstream.received[-1]
    assert seen.headers["authorization"] == "Bearer sk-upstream-openai-0123456789"
    assert edge.key not in json.dumps(seen.headers)
    assert "x-tuneloop-tags" not in seen.headers

    [sample] = edge.wait_for_samples(1, tag="support", source="gateway")
    assert sample["tags"] == ["support", "eu"]
    assert sample["response"]["provider"] == "openai"
    assert [call["name"] for call in sample["messages"][-1]["tool_calls"]] == [
        "get_current_weather"
    ] * 2
    assert edge.key not in json.dumps(sample)


def test_openai_streaming_passes_chunks_through_and_the_sample_is_reassembled(edge: Edge) -> None:
    client = openai.OpenAI(base_url=f"{edge.url}/v1", api_key=edge.key, max_retries=0)
    request = recorded("oa03_streaming_parallel_tool_calls_sse")["request"]["body"]
    stream = client.chat.completions.create(
        **request, extra_headers={"x-tuneloop-tags": "streamed"}
    )
    chunks = list(stream)
    arguments: dict[int, str] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            for call in choice.delta.tool_calls or []:
                arguments[call.index] = arguments.get(call.index, "") + (
                    call.function.arguments or ""
                )
    assert len(arguments) == 2
    assert all(json.loads(value) for value in arguments.values())

    [sample] = edge.wait_for_samples(1, tag="streamed")
    calls = sample["messages"][-1]["tool_calls"]
    assert [json.loads(call["arguments"]) for call in calls] == [
        json.loads(arguments[0]),
        json.loads(arguments[1]),
    ]
    assert sample["response"]["usage"]["output_tokens"] > 0


def test_anthropic_sdk_plain_gzip_and_streaming(edge: Edge) -> None:
    client = anthropic.Anthropic(base_url=edge.url, api_key=edge.key, max_retries=0)
    request = recorded("an03_parallel_tool_use_gzip")["request"]["body"]
    message = client.messages.create(
        **request, extra_headers={"x-tuneloop-tags": "anthropic-plain"}
    )
    assert [block.type for block in message.content] == ["text", "tool_use", "tool_use"]
    assert edge.upstream.received[-1].headers["x-api-key"] == "sk-ant-upstream-0123456789"

    streamed = recorded("an08_streaming_tool_use_input_json_delta_sse")["request"]["body"]
    with client.messages.stream(
        **{k: v for k, v in streamed.items() if k != "stream"},
        extra_headers={"x-tuneloop-tags": "anthropic-stream"},
    ) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"

    [plain] = edge.wait_for_samples(1, tag="anthropic-plain")
    [stream_sample] = edge.wait_for_samples(1, tag="anthropic-stream")
    assert len(plain["messages"][-1]["tool_calls"]) == 2
    tool_inputs = [
        json.loads(call["arguments"]) for call in stream_sample["messages"][-1]["tool_calls"]
    ]
    assert tool_inputs == [block.input for block in final.content if block.type == "tool_use"]


def test_gemini_rest_with_key_in_query_and_sse(edge: Edge) -> None:
    request = recorded("ge04_genai_inlineData_urlsafe_b64_sse")["request"]["body"]
    url = f"{edge.url}/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse&key={edge.key}"
    response = httpx.post(url, json=request, headers={"x-tuneloop-tags": "gemini"})
    assert response.status_code == 200
    assert response.text == recorded("ge04_genai_inlineData_urlsafe_b64_sse")["response"]["body"]
    seen = edge.upstream.received[-1]
    assert seen.path.endswith(":streamGenerateContent?alt=sse")  # our key never travels upstream
    assert seen.headers["x-goog-api-key"] == "AIzaUpstreamGemini0123456789"

    [sample] = edge.wait_for_samples(1, tag="gemini")
    images = [
        part
        for message in sample["messages"]
        for part in message["content"]
        if part["type"] == "image"
    ]
    assert images
    assert all(part["ref"].startswith("s3://") and "data" not in part for part in images)
    assert "/tenants/acme/media/" in images[0]["ref"]
    assert edge.key not in json.dumps(sample)  # the ?key= is not in what was captured


PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 3
PNG_B64 = base64.b64encode(PNG).decode()


def _images(sample: dict[str, object]) -> list[dict[str, str]]:
    messages = sample["messages"]
    assert isinstance(messages, list)
    return [part for m in messages for part in m["content"] if part["type"] == "image"]


def test_request_bytes_go_upstream_unchanged_and_images_are_stored_by_content(
    edge: Edge,
) -> None:
    """One PNG sent through each provider's API (a data URL, a base64 source, inline_data; the
    Gemini call non-streamed with the header its SDK sends): every body reaches the provider
    byte for byte, and every sample refers to the one S3 object holding the image's bytes."""
    # Odd but valid JSON (spacing, key order, escapes, 0.10): the provider gets these bytes.
    openai_body = (
        b'{ "messages" : [{"content":[{"type":"text","text":"caf\\u00e9 \\ud83d\\ude00 what is this?"},'
        b'{"type":"image_url","image_url":{"url":"data:image/png;base64,'
        + PNG_B64.encode()
        + b'"}}],'
        b'"role":"user"}],\n  "model":"gpt-4o-mini" ,"temperature":0.10}'
    )
    anthropic_body = orjson.dumps({"model": "claude-3-5-haiku-latest", "max_tokens": 50, "messages": [
        {"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG_B64}},
            {"type": "text", "text": "what is this?"}]}]})  # fmt: skip
    gemini_body = orjson.dumps({"contents": [{"role": "user", "parts": [
        {"inline_data": {"mime_type": "image/png", "data": PNG_B64}}, {"text": "what is this?"}]}]})  # fmt: skip
    calls = [
        ("/v1/chat/completions", openai_body, {"Authorization": f"Bearer {edge.key}"}),
        ("/v1/messages", anthropic_body, {"x-api-key": edge.key, "anthropic-version": "2023-06-01"}),
        ("/v1beta/models/gemini-2.5-flash:generateContent", gemini_body, {"x-goog-api-key": edge.key}),
    ]  # fmt: skip
    digest = hashlib.sha256(PNG).hexdigest()
    refs = set()
    for n, (path, body, key) in enumerate(calls):
        tag = f"bytes-{n}"
        headers = key | {"content-type": "application/json", "x-tuneloop-tags": tag}
        answer = httpx.post(f"{edge.url}{path}", content=body, headers=headers)
        assert answer.status_code == 200, (path, answer.text[:300])
        seen = edge.upstream.received[-1]
        assert seen.raw == body, path
        assert edge.key not in json.dumps(seen.headers)
        [sample] = edge.wait_for_samples(1, tag=tag)
        assert edge.key not in json.dumps(sample)
        [image] = _images(sample)
        assert (image["sha256"], image["mime_type"]) == (digest, "image/png")
        refs.add(image["ref"])
    [ref] = refs  # content-addressed: one object for the three
    assert ref.endswith(f"/tenants/acme/media/{digest[:2]}/{digest}")
    assert ObjectStore.from_settings(edge.settings.s3).get_bytes(ref) == PNG


def test_refusals_come_in_each_providers_shape(edge: Edge) -> None:
    oa = openai.OpenAI(base_url=f"{edge.url}/v1", api_key=edge.key, max_retries=0)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        oa.chat.completions.create(
            model="nobody-knows", messages=[{"role": "user", "content": "hi"}]
        )
    with pytest.raises(openai.AuthenticationError, match="not recognised"):
        openai.OpenAI(
            base_url=f"{edge.url}/v1", api_key="tl_abcdefgh_" + "x" * 43, max_retries=0
        ).chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}])
    an = anthropic.Anthropic(base_url=edge.url, api_key=edge.key, max_retries=0)
    with pytest.raises(anthropic.NotFoundError):
        an.messages.create(
            model="unknown-model", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
        )
    bad = httpx.post(
        f"{edge.url}/v1/chat/completions",
        content=b"{not json",
        headers={"Authorization": f"Bearer {edge.key}"},
    )
    assert bad.status_code == 400
    assert "not valid JSON" in bad.json()["error"]["message"]
    gemini = httpx.post(
        f"{edge.url}/v1beta/models/gemini-x:explode", json={}, headers={"x-goog-api-key": edge.key}
    )
    assert gemini.status_code == 404
    assert gemini.json()["error"]["status"] == "NOT_FOUND"
    # A model no Gemini upstream serves, with a valid key: Gemini's own 404 body.
    unknown = httpx.post(
        f"{edge.url}/v1beta/models/palm-2:generateContent",
        json={"contents": [{"parts": [{"text": "hi"}]}]},
        headers={"x-goog-api-key": edge.key},
    )
    assert unknown.status_code == 404
    error = unknown.json()["error"]
    assert (error["code"], error["status"]) == (404, "NOT_FOUND")
    assert "palm-2" in error["message"]
    # Anthropic's error shape names its type.
    refused = httpx.post(
        f"{edge.url}/v1/messages",
        json={"model": "unknown-model", "max_tokens": 5, "messages": []},
        headers={"x-api-key": edge.key},
    )
    assert refused.status_code == 404
    assert refused.json()["type"] == "error"
    assert refused.json()["error"]["type"] == "not_found_error"


def test_openai_responses_api_through_the_gateway_is_captured_plain_and_streamed(
    edge: Edge,
) -> None:
    oa = openai.OpenAI(base_url=f"{edge.url}/v1", api_key=edge.key, max_retries=0)
    answer = oa.responses.create(
        model="gpt-4.1",
        instructions="Tell bedtime stories.",
        input="Tell me a story",
        extra_headers={"x-tuneloop-tags": "responses-plain"},
    )
    assert answer.output_text == "In a peaceful grove beneath a silver moon..."
    events = list(
        oa.responses.create(
            model="gpt-4.1",
            input="Again",
            stream=True,
            extra_headers={"x-tuneloop-tags": "responses-stream"},
        )
    )
    assert [event.type for event in events][-1] == "response.completed"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == (
        answer.output_text
    )
    seen = edge.upstream.received[-1]
    assert seen.path == "/v1/responses"
    assert seen.headers["authorization"] == "Bearer sk-upstream-openai-0123456789"

    [plain] = edge.wait_for_samples(1, tag="responses-plain")
    assert [(m["role"], m["content"][0]["text"]) for m in plain["messages"]] == [
        ("system", "Tell bedtime stories."),
        ("user", "Tell me a story"),
        ("assistant", answer.output_text),
    ]
    assert plain["response"]["finish_reason"] == "stop"
    assert plain["response"]["usage"]["output_tokens"] == 87
    [streamed] = edge.wait_for_samples(1, tag="responses-stream")
    assert streamed["messages"][-1]["content"][0]["text"] == answer.output_text
    assert streamed["response"]["time_to_first_token_ms"] is not None


def test_calls_that_name_no_model_go_to_the_first_upstream_of_their_family(edge: Edge) -> None:
    # The Responses API's calls about a stored response, and moderations (model optional),
    # through the openai SDK: relayed with the keys swapped, none captured.
    tags = {"x-tuneloop-tags": "modelless"}
    oa = openai.OpenAI(base_url=f"{edge.url}/v1", api_key=edge.key, max_retries=0)
    stored = oa.responses.retrieve("resp_abc123", extra_headers=tags)
    assert (stored.id, stored.output_text) == (
        "resp_abc123",
        "In a peaceful grove beneath a silver moon...",
    )
    items = oa.responses.input_items.list("resp_abc123", limit=5, extra_headers=tags)
    assert [item.id for item in items.data] == ["msg_abc123"]
    assert oa.responses.cancel("resp_abc123", extra_headers=tags).status == "cancelled"
    oa.responses.delete("resp_abc123", extra_headers=tags)  # the SDK returns None for a 200
    verdict = oa.moderations.create(input="I love you", extra_headers=tags)
    assert verdict.results[0].flagged is False
    named = oa.moderations.create(model="gpt-moderation-x", input="hi", extra_headers=tags)
    assert named.model == "omni-moderation-latest"

    relayed = edge.upstream.received[-6:]
    assert [seen.path for seen in relayed] == [
        "/v1/responses/resp_abc123", "/v1/responses/resp_abc123/input_items",
        "/v1/responses/resp_abc123/cancel", "/v1/responses/resp_abc123",
        "/v1/moderations", "/v1/moderations",
    ]  # fmt: skip
    assert all(
        seen.headers["authorization"] == "Bearer sk-upstream-openai-0123456789" for seen in relayed
    )
    assert relayed[-1].body["model"] == "gpt-moderation-x"
    # A model that is named is routed as always: one nobody serves is the provider's 404.
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        oa.moderations.create(model="nobody-knows", input="x")
    # Only those calls: the rest of /v1/responses/... is not a provider call the gateway knows.
    unknown = httpx.post(
        f"{edge.url}/v1/responses/resp_abc123/explode",
        json={},
        headers={"Authorization": f"Bearer {edge.key}"},
    )
    assert unknown.status_code in (404, 405)
    asyncio.run(asyncio.sleep(1.0))  # room for a sample that should not be there
    assert edge.samples(tag="modelless") == []


def test_embeddings_and_token_counts_are_relayed_but_not_captured(edge: Edge) -> None:
    tags = {"x-tuneloop-tags": "relayed-only"}
    oa = openai.OpenAI(base_url=f"{edge.url}/v1", api_key=edge.key, max_retries=0)
    embedding = oa.embeddings.create(
        model="text-embedding-3-small", input="The food was delicious", extra_headers=tags
    )
    assert embedding.data[0].embedding == [0.0023064255, -0.009327292]
    legacy = oa.completions.create(
        model="gpt-3.5-turbo-instruct", prompt="Say this is a test", extra_headers=tags
    )
    assert legacy.choices[0].text == "\n\nThis is indeed a test"
    an = anthropic.Anthropic(base_url=edge.url, api_key=edge.key, max_retries=0)
    counted = an.messages.count_tokens(
        model="claude-sonnet-4-5", messages=[{"role": "user", "content": "Hi"}], extra_headers=tags
    )
    assert counted.input_tokens == 2095
    gemini = httpx.post(
        f"{edge.url}/v1beta/models/gemini-2.5-flash:countTokens?key={edge.key}",
        json={"contents": [{"role": "user", "parts": [{"text": "Hi"}]}]},
        headers=tags,
    )
    assert gemini.status_code == 200
    assert gemini.json()["totalTokens"] == 31

    relayed = edge.upstream.received[-4:]
    assert [seen.path for seen in relayed] == [
        "/v1/embeddings", "/v1/completions", "/v1/messages/count_tokens",
        "/v1beta/models/gemini-2.5-flash:countTokens",  # our ?key= never travels upstream
    ]  # fmt: skip
    assert relayed[-1].headers["x-goog-api-key"] == "AIzaUpstreamGemini0123456789"
    assert relayed[-2].headers["x-api-key"] == "sk-ant-upstream-0123456789"
    assert relayed[0].headers["authorization"] == "Bearer sk-upstream-openai-0123456789"
    assert all(edge.key not in json.dumps(seen.headers) for seen in relayed)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        oa.embeddings.create(model="nobody-knows", input="x")

    # None of them became a sample: a chat call made after them is the only one with the tag.
    chat = recorded("oa01_tool_calls_multiturn")["request"]["body"]
    oa.chat.completions.create(**chat, extra_headers=tags)
    [sample] = edge.wait_for_samples(1, tag="relayed-only")
    assert sample["response"]["model_requested"] == chat["model"]
    asyncio.run(asyncio.sleep(1.0))  # room for a late sample to show up
    assert len(edge.samples(tag="relayed-only")) == 1


def test_proxied_calls_say_who_served_them_and_are_counted_by_route(edge: Edge) -> None:
    # The proxy routes and /v1/traces are answered ahead of FastAPI (gateway/fastpath.py): they must
    # still carry the served-by header and show up in the request counter by route template.
    body = recorded("oa01_tool_calls_multiturn")["request"]["body"]
    answer = httpx.post(
        f"{edge.url}/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {edge.key}"},
    )
    assert answer.status_code == 200
    assert answer.headers["x-tuneloop-served-by"] == "ingest"
    refused = httpx.post(
        f"{edge.url}/v1beta/models/gemini-x:explode", json={}, headers={"x-goog-api-key": edge.key}
    )
    assert refused.headers["x-tuneloop-served-by"] == "ingest"
    # So is the OTLP receiver.
    export = httpx.post(
        f"{edge.url}/v1/traces", content=b"", headers={"Authorization": f"Bearer {edge.key}",
                                                       "content-type": "application/x-protobuf"},
    )  # fmt: skip
    assert (export.status_code, export.content) == (200, b"")
    assert export.headers["x-tuneloop-served-by"] == "ingest"

    def counted() -> bool:
        text = httpx.get(f"{edge.url}/metrics").text
        return all(
            any(line.startswith("http_server_requests_total{") and all(p in line for p in parts)
                for line in text.splitlines())
            for parts in (
                ('route="/v1/chat/completions"', 'status="200"', 'method="POST"'),
                ('route="/v1beta/models/{model_action}"', 'status="404"'),
                ('route="/v1/traces"', 'status="200"', 'method="POST"'),
            )
        )  # fmt: skip

    assert localstack.wait_until(counted, 10, interval_s=0.2)


def test_one_tenant_never_sees_anothers_samples(edge: Edge) -> None:
    mine = edge.wait_for_samples(1)
    assert edge.samples(key=edge.other_key) == []
    response = httpx.get(
        f"{edge.url}/v1/samples/{mine[0]['id']}",
        headers={"Authorization": f"Bearer {edge.other_key}"},
    )
    assert response.status_code == 404


def test_unknown_sample_filter_is_refused_by_name(edge: Edge) -> None:
    response = httpx.get(
        f"{edge.url}/v1/samples",
        params={"colour": "red"},
        headers={"Authorization": f"Bearer {edge.key}"},
    )
    assert response.status_code == 422
    assert "colour" in response.text


def test_control_plane_routes_are_relayed_to_the_owning_service(edge: Edge) -> None:
    headers = {"Authorization": f"Bearer {edge.key}"}
    # Each prefix goes to its owner (none of them runs yet: 503 naming the one that is away).
    for method, path, owner in [
        ("GET", "/v1/fine_tuning/jobs", "scheduler"),
        ("POST", "/v1/fine_tuning/jobs/ftjob-1/cancel", "scheduler"),
        ("GET", "/v1/models", "hoster"),
        ("DELETE", "/v1/models/ft:smol:acme", "hoster"),
        ("POST", "/v1/deployments", "hoster"),
        ("GET", "/v1/evals/ev-1", "evaluator"),
    ]:
        away = httpx.request(method, f"{edge.url}{path}", headers=headers)
        assert away.status_code == 503, (method, path)
        assert owner in away.json()["detail"], (method, path)

    scheduler = RunningProcess(
        localstack.component(edge.settings, "scheduler"),
        edge.settings.app.data_dir / "logs" / "scheduler.log",
        env=edge.env,
    )
    scheduler.start()
    try:
        relayed = httpx.get(f"{edge.url}/v1/fine_tuning/jobs?limit=2", headers=headers)
        assert relayed.headers["x-tuneloop-served-by"] == "scheduler"
        own = httpx.get(f"{edge.url}/v1/samples", headers=headers)
        assert own.headers["x-tuneloop-served-by"] == "ingest"
    finally:
        scheduler.stop()


def test_an_opentelemetry_sdk_exporter_pointed_at_the_gateway_just_works(edge: Edge) -> None:
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http import Compression
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    exporter = OTLPSpanExporter(
        endpoint=f"{edge.url}/v1/traces",
        headers={"Authorization": f"Bearer {edge.key}"},
        compression=Compression.Gzip,
    )
    provider = TracerProvider(resource=Resource.create({"service.name": "weather-agent"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("agent")
    user = {"role": "user", "parts": [{"type": "text", "content": "Weather in Paris?"}]}
    call = {
        "type": "tool_call",
        "id": "call_1",
        "name": "get_weather",
        "arguments": {"city": "Paris"},
    }
    asked = {"role": "assistant", "parts": [call], "finish_reason": "tool_call"}
    result = {
        "role": "tool",
        "parts": [{"type": "tool_call_response", "id": "call_1", "response": {"temp_c": 18}}],
    }
    answer = {
        "role": "assistant",
        "parts": [{"type": "text", "content": "18°C in Paris."}],
        "finish_reason": "stop",
    }

    def chat(
        span: trace.Span, messages: list[dict[str, object]], output: dict[str, object], tokens: int
    ) -> None:
        span.set_attributes(
            {
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": "openai",
                "gen_ai.request.model": "gpt-4o-mini",
                "gen_ai.input.messages": json.dumps(messages),
                "gen_ai.output.messages": json.dumps([output]),
                "gen_ai.usage.input_tokens": tokens,
                "gen_ai.usage.output_tokens": 7,
            }
        )

    with tracer.start_as_current_span("invoke_agent weather-agent") as root:
        trace_id = format(root.get_span_context().trace_id, "032x")
        with tracer.start_as_current_span("chat gpt-4o-mini") as span:
            chat(span, [user], asked, 12)
        with tracer.start_as_current_span("execute_tool get_weather") as span:
            span.set_attributes(
                {
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": "get_weather",
                    "gen_ai.tool.call.id": "call_1",
                    "gen_ai.tool.call.arguments": json.dumps({"city": "Paris"}),
                    "gen_ai.tool.call.result": json.dumps({"temp_c": 18}),
                }
            )
        with tracer.start_as_current_span("chat gpt-4o-mini") as span:
            chat(span, [user, asked, result], answer, 30)
    provider.shutdown()

    # Each span came in its own export: the conversation's sample grows to its full length.
    def grown() -> bool:
        found = edge.samples(source="otlp")
        return len(found) == 1 and len(found[0]["messages"]) == 4

    assert localstack.wait_until(grown, 40, interval_s=0.2), edge.samples(source="otlp")
    [sample] = edge.samples(source="otlp")
    assert [message["role"] for message in sample["messages"]] == [
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    assert sample["messages"][1]["tool_calls"][0]["name"] == "get_weather"
    assert sample["messages"][-1]["content"][0]["text"] == "18°C in Paris."
    assert sample["response"]["usage"]["input_tokens"] == 30
    assert sample["source_ref"].startswith(f"{trace_id}/")  # one conversation of this trace


@pytest.mark.parametrize("encoding", ["json", "protobuf"])
def test_rejected_spans_are_answered_with_otlp_partial_success(edge: Edge, encoding: str) -> None:
    """Over HTTP, in the export's own encoding: the good trace is stored, the span whose
    messages cannot be read is counted as rejected, and the message names its attribute."""
    factory = TraceFactory(seed=23 if encoding == "json" else 29)
    good, bad = factory.trace(), factory.trace()
    broken = next(s for s in bad if s.attributes.get("gen_ai.operation.name") == "chat")
    broken.attributes["gen_ai.input.messages"] = "[{not json"
    body = (to_json if encoding == "json" else to_protobuf)([*good, *bad])
    content_type = "application/json" if encoding == "json" else "application/x-protobuf"
    answer = httpx.post(
        f"{edge.url}/v1/traces",
        content=body,
        headers={"Authorization": f"Bearer {edge.key}", "content-type": content_type},
    )
    assert answer.status_code == 200
    if encoding == "json":
        partial = answer.json()["partialSuccess"]
        rejected, message = int(partial["rejectedSpans"]), partial["errorMessage"]
    else:
        response = ExportTraceServiceResponse.FromString(answer.content)
        rejected = response.partial_success.rejected_spans
        message = response.partial_success.error_message
    assert rejected == 1
    assert "gen_ai.input.messages" in message
    assert f"span {broken.span_id}: gen_ai.input.messages: not valid JSON" in message

    def traces_stored() -> set[str]:
        return {s["source_ref"].split("/")[0] for s in edge.samples(source="otlp", limit=1000)}

    # The good trace is stored, and so is the bad one: its later chat spans resend the history.
    both = {good[0].trace_id, bad[0].trace_id}
    assert localstack.wait_until(lambda: both <= traces_stored(), 20, interval_s=0.2)


def test_large_exports_are_mapped_in_pool_processes_and_every_sample_stored(edge: Edge) -> None:
    tenant = {"id": "bulk-otlp", "name": "bulk"}
    assert httpx.post(f"{edge.url}/v1/admin/tenants", json=tenant, headers=ADMIN).is_success
    key = httpx.post(f"{edge.url}/v1/admin/tenants/bulk-otlp/api_keys", json={"name": "t"},
                     headers=ADMIN).json()["key"]  # fmt: skip
    factory = TraceFactory(seed=5)
    expected: dict[str, Sample] = {}
    for encoding, content_type in (("protobuf", "application/x-protobuf"),
                                   ("json", "application/json")):  # fmt: skip
        [body] = export_bodies(factory, requests=1, traces_per_request=20, encoding=encoding)
        assert len(body) >= IngestSettings().otlp_process_min_bytes
        answer = httpx.post(f"{edge.url}/v1/traces", content=body,
                            headers={"Authorization": f"Bearer {key}", "content-type": content_type})  # fmt: skip
        assert answer.status_code == 200, answer.text
        mapped = map_export(body, content_type, None, "bulk-otlp")
        assert not mapped.rejected
        expected |= {
            item.sample_id: SampleCaptured.model_validate_json(item.event.payload).sample
            for item in mapped.prepared
        }
    # The service's pool processes did the mapping (spawned children of the service).
    children = psutil.Process(edge.process.process.pid).children(recursive=True)
    assert any("spawn_main" in " ".join(child.cmdline()) for child in children)
    stored = edge.wait_for_samples(40, key=key, source="otlp", limit=100)
    assert {sample["id"] for sample in stored} == set(expected)
    for sample in stored:
        assert Sample.model_validate(sample).messages == expected[sample["id"]].messages
    # Each export's 20 samples went out as one bundle: two messages on the tenant's subject.
    assert asyncio.run(_messages_on(edge, SampleCaptured.subject_for("bulk-otlp"))) == 2


async def _messages_on(edge: Edge, subject: str) -> int:
    connection = await nats.connect(edge.settings.nats.url)
    try:
        info = await connection.jetstream().stream_info(SAMPLES.name, subjects_filter=subject)
        return (info.state.subjects or {}).get(subject, 0)
    finally:
        await connection.close()


def test_otlp_fixtures_and_bad_bodies_get_otlp_answers(edge: Edge) -> None:
    exports = Path(__file__).resolve().parents[5] / "shared" / "fixtures" / "otlp" / "exports"
    headers = {"Authorization": f"Bearer {edge.key}"}
    plain = httpx.post(
        f"{edge.url}/v1/traces",
        content=(exports / "ot02_otlp_proto_example_trace.protobuf-bin").read_bytes(),
        headers=headers | {"content-type": "application/x-protobuf"},
    )
    assert plain.status_code == 200
    assert plain.headers["content-type"] == "application/x-protobuf"
    garbage = httpx.post(
        f"{edge.url}/v1/traces",
        content=b"\x0a\xff\xff",
        headers=headers | {"content-type": "application/x-protobuf"},
    )
    # Failures are a google.rpc.Status in the request's encoding; a 400 names the bad field.
    assert garbage.status_code == 400
    assert garbage.headers["content-type"] == "application/x-protobuf"
    status = Status.FromString(garbage.content)
    assert status.code == 3
    assert status.message.startswith("body: not a valid ExportTraceServiceRequest")
    violations = BadRequest()
    assert status.details[0].Unpack(violations)
    assert violations.field_violations[0].field == "body"
    bad_id = {
        "resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "abc", "spanId": "00" * 8}]}]}]
    }
    bad_json = httpx.post(f"{edge.url}/v1/traces", json=bad_id, headers=headers)
    assert bad_json.status_code == 400
    assert bad_json.headers["content-type"] == "application/json"
    field = "resourceSpans[0].scopeSpans[0].spans[0].traceId"
    assert bad_json.json()["details"][0]["fieldViolations"][0]["field"] == field
    assert bad_json.json()["message"].startswith(f"{field}: ")
    wrong_type = httpx.post(
        f"{edge.url}/v1/traces", content=b"{}", headers=headers | {"content-type": "text/plain"}
    )
    assert wrong_type.status_code == 415
    assert "text/plain" in wrong_type.json()["message"]
    nobody = httpx.post(
        f"{edge.url}/v1/traces", content=b"", headers={"content-type": "application/x-protobuf"}
    )
    assert nobody.status_code == 401
    assert Status.FromString(nobody.content).code == 16


async def _announce(settings: Settings, event: Event) -> None:
    """Publish `event` as the hoster would."""
    broker = bus.make_broker(settings.nats, service="hoster-test")
    await bus.connect(broker, settings.nats)
    try:
        await bus.publish(broker, event)
    finally:
        await broker.stop()


def _deployed(served_model_name: str, version_id: str, endpoint: str) -> DeploymentReady:
    return DeploymentReady(
        tenant="acme",
        deployment_id=f"dep-{version_id}",
        served_model_name=served_model_name,
        endpoint_url=endpoint,
        version_id=version_id,
    )


def _wait_routed(client: openai.OpenAI, model: str) -> None:
    def routed() -> bool:
        try:
            client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "hi"}]
            )
        except openai.NotFoundError:
            return False
        return True

    assert localstack.wait_until(routed, 15, interval_s=0.2)


def _acme_key(url: str) -> str:
    tenant = {"id": "acme", "name": "Acme"}
    assert httpx.post(f"{url}/v1/admin/tenants", json=tenant, headers=ADMIN).status_code == 201
    created = httpx.post(f"{url}/v1/admin/tenants/acme/api_keys", json={"name": "t"}, headers=ADMIN)
    return str(created.json()["key"])


def _check_answers_tagged_with_the_version(
    url: str, key: str, model: str, version_id: str, tag: str
) -> None:
    """The deployed model answers through the gateway (the openai SDK, plain and streamed), and
    both answers are captured tagged `model_version:<version_id>`, which GET /v1/samples filters
    on; a caller cannot set that tag itself."""
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
    messages = [{"role": "user", "content": "My invoice is wrong, who do I ask?"}]
    headers = {"x-tuneloop-tags": tag}
    completion = client.chat.completions.create(
        model=model, messages=messages, extra_headers=headers
    )
    assert completion.model == model
    assert completion.choices[0].message.content == ENGINE_ANSWER
    stream = client.chat.completions.create(
        model=model, messages=messages, stream=True, extra_headers=headers
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == ENGINE_ANSWER

    version_tag = f"model_version:{version_id}"
    found: list[dict[str, Any]] = []

    def captured() -> bool:
        nonlocal found
        answer = httpx.get(
            f"{url}/v1/samples",
            params={"tag": [tag, version_tag]},
            headers={"Authorization": f"Bearer {key}"},
        )
        found = answer.json()["data"]
        return len(found) >= 2

    assert localstack.wait_until(captured, 40, interval_s=0.2), found
    assert len(found) == 2
    for sample in found:
        assert sample["tags"] == [tag, version_tag]
        assert sample["response"]["model"] == model
        assert sample["messages"][-1]["content"] == [{"type": "text", "text": ENGINE_ANSWER}]

    with pytest.raises(openai.BadRequestError, match="reserved prefix 'model_version:'"):
        client.chat.completions.create(
            model=model, messages=messages, extra_headers={"x-tuneloop-tags": "model_version:v9"}
        )


def test_a_model_the_hoster_deployed_is_routed_to_its_deployment(
    edge: Edge, stack_settings: Settings
) -> None:
    client = openai.OpenAI(base_url=f"{edge.url}/v1", api_key=edge.key, max_retries=0)
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="acme-support-v3", messages=messages)

    endpoint = f"{edge.upstream.base_url}/deployed"
    ready = _deployed("acme-support-v3", "mv-1", endpoint)
    asyncio.run(_announce(stack_settings, ready))
    _wait_routed(client, "acme-support-v3")
    seen = edge.upstream.received[-1]
    assert seen.path == "/deployed/v1/chat/completions"
    assert "authorization" not in seen.headers  # no provider key for our own deployment
    # Captured by the journal and its shipper (the default capture mode), tagged.
    _check_answers_tagged_with_the_version(edge.url, edge.key, "acme-support-v3", "mv-1", "dep")
    seen = edge.upstream.received[-1]
    # The deployment is acme's: another tenant naming the model is not routed to it.
    other = openai.OpenAI(base_url=f"{edge.url}/v1", api_key=edge.other_key, max_retries=0)
    with pytest.raises(openai.NotFoundError):
        other.chat.completions.create(model="acme-support-v3", messages=messages)
    assert edge.upstream.received[-1] is seen

    stopped = DeploymentStopped(
        tenant="acme", deployment_id=ready.deployment_id, served_model_name="acme-support-v3"
    )
    asyncio.run(_announce(stack_settings, stopped))

    def unrouted() -> bool:
        try:
            client.chat.completions.create(model="acme-support-v3", messages=messages)
        except openai.NotFoundError:
            return True
        return False

    assert localstack.wait_until(unrouted, 15, interval_s=0.2)

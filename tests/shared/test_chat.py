"""The canonical chat sample holds what real provider exchanges carry, round-trips exactly,
exports to OpenAI's fine-tuning shape and rejects bad input naming the field.

The samples below are built by hand from the real fixtures (what ingest should produce from
them); strings, ids and arguments are read from the fixture files, not retyped.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from shared.chat import (
    ImagePart,
    Message,
    ProviderError,
    ReasoningBlock,
    RequestParams,
    ResponseMeta,
    Sample,
    TextPart,
    ToolCall,
    ToolDef,
    Usage,
    derive_sample_id,
    describe_errors,
    error_path,
    normalize_finish_reason,
    to_openai_messages,
)
from shared.chat.identity import SAMPLE_ID_NAMESPACE, canonical_json

TENANT = "acme"
Pairs = list[dict[str, Any]]


def _fixtures_dir() -> Path | None:
    here = Path(__file__).resolve()
    candidates = [os.environ.get("TUNELOOP_FIXTURES_DIR")]
    candidates += [str(parent / "shared" / "fixtures") for parent in here.parents[2:4]]
    for candidate in candidates:
        if candidate and (Path(candidate) / "chat" / "derived").is_dir():
            return Path(candidate)
    return None


@pytest.fixture(scope="module")
def load_pairs() -> Callable[[str], Pairs]:
    root = _fixtures_dir()
    if root is None:
        pytest.skip("conformance fixtures not found (set TUNELOOP_FIXTURES_DIR)")

    def load(short: str) -> Pairs:
        (path,) = (root / "chat" / "derived").glob(f"{short}_*.pairs.json")
        pairs: Pairs = json.loads(path.read_text(encoding="utf-8"))
        return pairs

    return load


def _body(pair: dict[str, Any], side: str) -> dict[str, Any]:
    body: dict[str, Any] = pair[side]["body"]
    return body


def _when(unix: int | None = None) -> datetime:
    return datetime.fromtimestamp(unix, UTC) if unix else datetime(2025, 8, 19, 14, 55, tzinfo=UTC)


# --- what ingest should make of the fixtures --------------------------------------------------


def _openai_usage(usage: dict[str, Any]) -> Usage:
    return Usage(
        input_tokens=usage["prompt_tokens"],
        output_tokens=usage["completion_tokens"],
        total_tokens=usage["total_tokens"],
        cached_input_tokens=usage.get("prompt_tokens_details", {}).get("cached_tokens"),
        reasoning_tokens=usage.get("completion_tokens_details", {}).get("reasoning_tokens"),
    )


def _openai_message(raw: dict[str, Any]) -> Message:
    content = raw.get("content")
    if isinstance(content, list):
        content = [
            ImagePart(url=p["image_url"]["url"])
            if p["type"] == "image_url"
            else TextPart(text=p["text"])
            for p in content
        ]
    calls = [
        ToolCall(id=c["id"], name=c["function"]["name"], arguments=c["function"]["arguments"])
        for c in raw.get("tool_calls") or []
    ]
    return Message(
        role=raw["role"],
        content=content,
        tool_calls=calls,
        tool_call_id=raw.get("tool_call_id"),
        refusal=raw.get("refusal"),
    )


def openai_samples(pair: dict[str, Any]) -> list[Sample]:
    """One sample per choice of an OpenAI chat completion exchange."""
    req, resp = _body(pair, "request"), _body(pair, "response")
    prompt = [_openai_message(m) for m in req["messages"]]
    tools = [
        ToolDef(
            name=t["function"]["name"],
            description=t["function"].get("description"),
            parameters=t["function"].get("parameters"),
        )
        for t in req.get("tools", [])
    ]
    params = RequestParams(
        tool_choice=req.get("tool_choice"), n=req.get("n"), stream=req.get("stream")
    )
    if "error" in resp:
        body = resp["error"]
        error = ProviderError(
            status_code=pair["response"]["status"],
            type=body["type"],
            code=body["code"],
            message=body["message"],
        )
        meta = ResponseMeta(
            provider="openai", model_requested=req["model"], status="error", error=error
        )
        return [_sample(prompt, tools, params, meta, source_ref="req-failed")]
    samples = []
    for choice in resp["choices"]:
        meta = ResponseMeta(
            provider="openai",
            model_requested=req["model"],
            model=resp["model"],
            response_id=resp["id"],
            choice_index=choice["index"],
            finish_reason_raw=choice["finish_reason"],
            usage=_openai_usage(resp["usage"]),
        )
        answer = _openai_message(choice["message"])
        samples.append(_sample([*prompt, answer], tools, params, meta, resp["id"], resp["created"]))
    return samples


def _sample(
    messages: list[Message],
    tools: list[ToolDef],
    params: RequestParams,
    meta: ResponseMeta,
    source_ref: str,
    created: int | None = None,
) -> Sample:
    return Sample(
        tenant=TENANT,
        source="gateway",
        source_ref=source_ref,
        created_at=_when(created),
        messages=messages,
        tools=tools,
        params=params,
        response=meta,
    )


def _anthropic_blocks(role: str, content: str | list[dict[str, Any]]) -> list[Message]:
    """One Anthropic turn -> canonical messages (tool_result blocks become tool messages)."""
    if isinstance(content, str):
        return [Message(role=role, content=content)]
    results = [b for b in content if b["type"] == "tool_result"]
    if results:
        return [
            Message(
                role="tool",
                tool_call_id=b["tool_use_id"],
                content=b["content"],
                is_error=b.get("is_error", False),
            )
            for b in results
        ]
    return [
        Message(
            role=role,
            content=[TextPart(text=b["text"]) for b in content if b["type"] == "text"],
            tool_calls=[
                ToolCall(id=b["id"], name=b["name"], arguments=b["input"])
                for b in content
                if b["type"] == "tool_use"
            ],
            reasoning=[
                ReasoningBlock(text=b["thinking"], signature=b["signature"])
                for b in content
                if b["type"] == "thinking"
            ],
        )
    ]


def anthropic_sample(pair: dict[str, Any]) -> Sample:
    req, resp = _body(pair, "request"), _body(pair, "response")
    messages: list[Message] = []
    system = req.get("system")
    if system is not None:
        blocks = [system] if isinstance(system, str) else [b["text"] for b in system]
        messages.append(Message(role="system", content=[TextPart(text=t) for t in blocks]))
    for turn in req["messages"]:
        messages += _anthropic_blocks(turn["role"], turn["content"])
    messages += _anthropic_blocks("assistant", resp["content"])
    usage = resp["usage"]
    cache_read = usage.get("cache_read_input_tokens", 0)
    input_tokens = usage["input_tokens"] + cache_read + usage.get("cache_creation_input_tokens", 0)
    meta = ResponseMeta(
        provider="anthropic",
        model_requested=req["model"],
        model=resp["model"],
        response_id=resp["id"],
        finish_reason_raw=resp["stop_reason"],
        usage=Usage(
            input_tokens=input_tokens,
            output_tokens=usage["output_tokens"],
            total_tokens=input_tokens + usage["output_tokens"],
            cached_input_tokens=cache_read,
        ),
    )
    tools = [
        ToolDef(name=t["name"], description=t.get("description"), parameters=t["input_schema"])
        for t in req.get("tools", [])
    ]
    params = RequestParams(
        max_tokens=req["max_tokens"], **({"thinking": req["thinking"]} if "thinking" in req else {})
    )
    return _sample(messages, tools, params, meta, resp["id"])


def gemini_ge01_sample(pair: dict[str, Any]) -> Sample:
    req, resp = _body(pair, "request"), _body(pair, "response")
    user, model_turn, results = req["contents"]
    calls = [
        ToolCall(name=p["functionCall"]["name"], arguments=p["functionCall"]["args"])
        for p in model_turn["parts"]
    ]
    tool_messages = [
        Message(
            role="tool",
            name=p["functionResponse"]["name"],
            content=json.dumps(p["functionResponse"]["response"], ensure_ascii=False),
        )
        for p in results["parts"]
    ]
    (candidate,) = resp["candidates"]
    (answer,) = candidate["content"]["parts"]
    decl = req["tools"][0]["functionDeclarations"][0]
    location = decl["parameters"]["properties"]["location"]
    usage = resp["usageMetadata"]
    meta = ResponseMeta(
        provider="gemini",
        model_requested="gemini-2.5-pro",
        model=resp["modelVersion"],
        response_id=resp["responseId"],
        finish_reason_raw=candidate["finishReason"],
        usage=Usage(
            input_tokens=usage["promptTokenCount"],
            output_tokens=usage["candidatesTokenCount"] + usage["thoughtsTokenCount"],
            total_tokens=usage["totalTokenCount"],
            reasoning_tokens=usage["thoughtsTokenCount"],
        ),
    )
    messages = [
        Message(role="user", content=user["parts"][0]["text"]),
        Message(role="assistant", tool_calls=calls),
        *tool_messages,
        Message(
            role="assistant",
            content=answer["text"],
            reasoning=[ReasoningBlock(signature=answer["thoughtSignature"])],
        ),
    ]
    # Ingest maps Gemini's integer enum types (6 = OBJECT, 1 = STRING) onto JSON Schema.
    tool = ToolDef(
        name=decl["name"],
        description=decl["description"],
        parameters={
            "type": "object",
            "properties": {"location": {"type": "string", "description": location["description"]}},
        },
    )
    return _sample(messages, [tool], RequestParams(), meta, resp["responseId"])


FIXTURE_SAMPLES: dict[str, Callable[[Callable[[str], Pairs]], list[Sample]]] = {
    "oa01": lambda load: [s for pair in load("oa01") for s in openai_samples(pair)],
    "oa02": lambda load: openai_samples(load("oa02")[0]),
    "oa04": lambda load: openai_samples(load("oa04")[0]),
    "oa05": lambda load: openai_samples(load("oa05")[0]),
    "an03": lambda load: [anthropic_sample(load("an03")[0])],
    "an04": lambda load: [anthropic_sample(load("an04")[0])],
    "an05": lambda load: [anthropic_sample(load("an05")[0])],
    "an06": lambda load: [anthropic_sample(load("an06")[0])],
    "an07": lambda load: [anthropic_sample(load("an07")[0])],
    "ge01": lambda load: [gemini_ge01_sample(load("ge01")[0])],
}


# --- fixtures become samples that survive a round trip ----------------------------------------


@pytest.mark.parametrize("short", sorted(FIXTURE_SAMPLES))
def test_fixture_samples_round_trip_through_json(
    short: str, load_pairs: Callable[[str], Pairs]
) -> None:
    for sample in FIXTURE_SAMPLES[short](load_pairs):
        data = sample.to_json_bytes()
        again = Sample.from_json_bytes(data)
        assert again == sample
        assert again.to_json_bytes() == data
        assert Sample.from_json_bytes(data.decode()) == sample
        # Compact: unset fields are left out rather than written as null.
        stored = json.loads(data)
        assert None not in stored.values()
        assert all(None not in m.values() for m in stored["messages"])


def test_oa01_tool_call_turn_exports_as_the_replayed_request(
    load_pairs: Callable[[str], Pairs],
) -> None:
    first, second = load_pairs("oa01")
    (calling,) = openai_samples(first)
    (final,) = openai_samples(second)

    assert calling.response is not None
    assert calling.response.finish_reason == "tool_calls"
    assert [c.parse_arguments() for c in calling.messages[-1].tool_calls] == [
        {"location": "Seattle, WA"},
        {"location": "San Francisco, CA"},
    ]
    exported = to_openai_messages(calling)
    assert exported["tools"] == _body(first, "request")["tools"]
    # The history the client replayed in exchange 2 is exactly our export of exchange 1.
    assert exported["messages"] == _body(second, "request")["messages"][:3]

    replayed = to_openai_messages(final)
    assert replayed["messages"][:-1] == _body(second, "request")["messages"]
    assert "tools" not in replayed  # the replay request offered none
    answer = _body(second, "response")["choices"][0]["message"]["content"]
    assert replayed["messages"][-1] == {"role": "assistant", "content": answer}


def test_oa01_prompt_and_completion_split_at_the_final_assistant_turn(
    load_pairs: Callable[[str], Pairs],
) -> None:
    (final,) = openai_samples(load_pairs("oa01")[1])
    assert [m.role for m in final.prompt_messages()] == [
        "system",
        "user",
        "assistant",
        "tool",
        "tool",
    ]
    completion = final.completion()
    assert completion is not None
    assert completion.text().startswith("Today, the weather in Seattle")
    assert final.response is not None
    assert final.response.usage == Usage(
        input_tokens=99,
        output_tokens=25,
        total_tokens=124,
        cached_input_tokens=0,
        reasoning_tokens=0,
    )


def test_oa02_two_choices_become_two_samples_with_distinct_ids(
    load_pairs: Callable[[str], Pairs],
) -> None:
    first, second = openai_samples(load_pairs("oa02")[0])
    assert first.response is not None
    assert second.response is not None
    assert (first.response.choice_index, second.response.choice_index) == (0, 1)
    assert first.source_ref == second.source_ref
    assert first.id != second.id
    # Both choices say the same thing, so exact dedup will keep one.
    assert first.content_fingerprint() == second.content_fingerprint()


def test_oa04_failed_call_keeps_the_prompt_and_the_error(
    load_pairs: Callable[[str], Pairs],
) -> None:
    pair = load_pairs("oa04")[0]
    (failed,) = openai_samples(pair)
    assert failed.completion() is None
    assert failed.prompt_messages() == failed.messages
    assert failed.response is not None
    assert (failed.response.status, failed.response.finish_reason) == ("error", "error")
    assert failed.response.error == ProviderError(
        status_code=404,
        type="invalid_request_error",
        code="model_not_found",
        message=_body(pair, "response")["error"]["message"],
    )


def test_oa05_inline_image_is_stored_as_data_and_exported_as_the_same_data_uri(
    load_pairs: Callable[[str], Pairs],
) -> None:
    pair = load_pairs("oa05")[0]
    (sample,) = openai_samples(pair)
    raw_parts = _body(pair, "request")["messages"][0]["content"]
    text, image = sample.messages[0].content
    assert isinstance(image, ImagePart)
    assert isinstance(text, TextPart)
    assert (image.mime_type, image.url, image.ref) == ("image/png", None, None)
    assert image.content_sha256() == hashlib.sha256(base64.b64decode(image.data or "")).hexdigest()
    assert to_openai_messages(sample)["messages"][0]["content"] == raw_parts

    # After ingest moves the bytes to S3 the sample means the same thing.
    moved = sample.model_copy(deep=True)
    moved.messages[0].content[1] = ImagePart(
        ref="s3://tuneloop-images/acme/x.png", mime_type="image/png", sha256=image.content_sha256()
    )
    assert moved.content_fingerprint() == sample.content_fingerprint()
    resolved = to_openai_messages(moved, resolve_ref=lambda part: f"https://s3.local/{part.sha256}")
    assert resolved["messages"][0]["content"][1]["image_url"]["url"].endswith(
        str(image.content_sha256())
    )
    assert to_openai_messages(moved)["messages"][0]["content"][1]["image_url"]["url"].startswith(
        "s3://"
    )


def test_an03_tool_use_input_objects_become_json_argument_strings(
    load_pairs: Callable[[str], Pairs],
) -> None:
    pair = load_pairs("an03")[0]
    (sample,) = FIXTURE_SAMPLES["an03"](load_pairs)
    blocks = _body(pair, "response")["content"]
    completion = sample.completion()
    assert completion is not None
    assert completion.text() == blocks[0]["text"]
    exported = to_openai_messages(sample)["messages"][-1]["tool_calls"]
    assert [(c["id"], c["function"]["name"]) for c in exported] == [
        (b["id"], b["name"]) for b in blocks[1:]
    ]
    assert [json.loads(c["function"]["arguments"]) for c in exported] == [
        b["input"] for b in blocks[1:]
    ]
    assert sample.response is not None
    assert sample.response.finish_reason == "tool_calls"
    assert [t.parameters for t in sample.tools] == [
        t["input_schema"] for t in _body(pair, "request")["tools"]
    ]


def test_an04_tool_result_in_a_user_turn_becomes_a_paired_tool_message(
    load_pairs: Callable[[str], Pairs],
) -> None:
    (sample,) = FIXTURE_SAMPLES["an04"](load_pairs)
    assert [m.role for m in sample.prompt_messages()] == ["user", "assistant", "tool"]
    exported = to_openai_messages(sample)["messages"]
    assert exported[1]["tool_calls"][0]["id"] == exported[2]["tool_call_id"] == "call_1"
    assert exported[2]["content"] == "Sunny and 65 degrees Fahrenheit"
    completion = sample.completion()
    assert completion is not None
    assert completion.tool_calls[0].parse_arguments() == {"timezone": "America/Los_Angeles"}


def test_an05_unicode_survives_and_is_error_false_is_kept(
    load_pairs: Callable[[str], Pairs],
) -> None:
    (sample,) = FIXTURE_SAMPLES["an05"](load_pairs)
    tool = sample.messages[2]
    assert tool.role == "tool"
    assert tool.is_error is False
    completion = sample.completion()
    assert completion is not None
    assert "75°F" in completion.text()
    assert "\u2600\ufe0f" in completion.text()
    assert Sample.from_json_bytes(sample.to_json_bytes()).messages[-1].text() == completion.text()


def test_an06_thinking_is_kept_apart_from_the_visible_answer(
    load_pairs: Callable[[str], Pairs],
) -> None:
    pair = load_pairs("an06")[0]
    (sample,) = FIXTURE_SAMPLES["an06"](load_pairs)
    thinking, text = _body(pair, "response")["content"]
    completion = sample.completion()
    assert completion is not None
    assert completion.text() == text["text"]
    assert completion.reasoning == [
        ReasoningBlock(text=thinking["thinking"], signature=thinking["signature"])
    ]
    plain = to_openai_messages(sample)["messages"][-1]
    assert plain == {"role": "assistant", "content": text["text"]}
    with_reasoning = to_openai_messages(sample, include_reasoning=True)["messages"][-1]
    assert with_reasoning["reasoning_content"] == thinking["thinking"]
    again = Sample.from_json_bytes(sample.to_json_bytes())
    assert again.params.model_extra == {"thinking": {"type": "enabled", "budget_tokens": 1024}}
    assert again.params.max_tokens == 2048


def test_an07_system_blocks_stay_separate_parts(load_pairs: Callable[[str], Pairs]) -> None:
    pair = load_pairs("an07")[0]
    (sample,) = FIXTURE_SAMPLES["an07"](load_pairs)
    system = sample.messages[0]
    assert system.role == "system"
    assert [p.text for p in system.content if isinstance(p, TextPart)] == [
        b["text"] for b in _body(pair, "request")["system"]
    ]
    assert sample.response is not None
    assert sample.response.usage is not None
    assert sample.response.usage.input_tokens == 4 + 1163  # cache writes count as input


def test_ge01_calls_without_ids_pair_with_results_by_order(
    load_pairs: Callable[[str], Pairs],
) -> None:
    pair = load_pairs("ge01")[0]
    (sample,) = FIXTURE_SAMPLES["ge01"](load_pairs)
    calls = sample.messages[1].tool_calls
    assert [c.id for c in calls] == [None, None]
    model_parts = _body(pair, "request")["contents"][1]["parts"]
    assert [c.parse_arguments() for c in calls] == [p["functionCall"]["args"] for p in model_parts]

    exported = to_openai_messages(sample)["messages"]
    call_ids = [c["id"] for c in exported[1]["tool_calls"]]
    assert call_ids == ["call_1_0", "call_1_1"]
    assert [exported[2]["tool_call_id"], exported[3]["tool_call_id"]] == call_ids
    assert json.loads(exported[2]["content"]) == {"content": '{"temperature": 35, "unit": "C"}'}

    meta = sample.response
    assert meta is not None
    assert meta.usage is not None
    assert (meta.finish_reason, meta.finish_reason_raw) == ("stop", 1)
    assert meta.usage.input_tokens + meta.usage.output_tokens == meta.usage.total_tokens
    completion = sample.completion()
    assert completion is not None
    (answer,) = _body(pair, "response")["candidates"][0]["content"]["parts"]
    assert completion.reasoning == [ReasoningBlock(signature=answer["thoughtSignature"])]
    assert "°C" in completion.text()


def test_results_without_ids_prefer_the_call_with_the_same_name() -> None:
    sample = _minimal(
        Message(role="user", content="weather and time?"),
        Message(role="assistant", tool_calls=[ToolCall(name="weather"), ToolCall(name="time")]),
        Message(role="tool", name="time", content="noon"),
        Message(role="tool", name="weather", content="rain"),
    )
    exported = to_openai_messages(sample)["messages"]
    assert [m["tool_call_id"] for m in exported[2:]] == ["call_1_1", "call_1_0"]


# --- identity --------------------------------------------------------------------------------


def _minimal(*messages: Message, **fields: Any) -> Sample:
    fields.setdefault("created_at", _when())
    return Sample(tenant=TENANT, source="upload", messages=list(messages), **fields)


def test_derived_ids_are_deterministic_and_depend_on_every_input() -> None:
    base = derive_sample_id("acme", "gateway", "req-1")
    assert base == derive_sample_id("acme", "gateway", "req-1")
    others = {
        derive_sample_id("other", "gateway", "req-1"),
        derive_sample_id("acme", "upload", "req-1"),
        derive_sample_id("acme", "gateway", "req-2"),
        derive_sample_id("acme", "gateway", "req-1", choice_index=1),
    }
    assert base not in others
    assert len(others) == 4


@pytest.mark.parametrize(
    ("source_ref", "choice"), [("req-1", 0), ("trace/0af7", 3), ("naïve 漢字 😀", 1), ("", 0)]
)
def test_sample_ids_are_uuid5_of_the_canonical_name(source_ref: str, choice: int) -> None:
    # derive_sample_id computes uuid5 by hand for speed: it must stay the standard uuid5,
    # since every stored sample id was made with it.
    name = canonical_json(["acme", "otlp", source_ref, choice]).decode()
    expected = str(uuid.uuid5(SAMPLE_ID_NAMESPACE, name))
    assert derive_sample_id("acme", "otlp", source_ref, choice) == expected


@pytest.mark.parametrize(
    ("message", "fragment"),
    [
        ({"role": "user", "content": "x", "reasoning": [{"text": "t"}]}, "reasoning is only"),
        ({"role": "tool", "name": "f", "refusal": ""}, "refusal is only allowed on assistant"),
        ({"role": "system", "content": "x", "weight": 0}, "weight is only allowed on assistant"),
        ({"role": "user", "content": "x", "is_error": True}, "is_error is only allowed on tool"),
        ({"role": "assistant", "tool_call_id": "c1"}, "tool_call_id is only allowed on tool"),
        (
            {
                "role": "assistant",
                "tool_calls": [{"id": "a", "name": "f"}, {"id": "a", "name": "g"}],
            },
            "ids must be unique",
        ),
    ],
)
def test_role_fields_are_checked(message: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ValidationError, match=fragment):
        Message.model_validate(message)


def test_role_fields_that_belong_pass() -> None:
    calls = [{"id": "a", "name": "f"}, {"id": None, "name": "g"}, {"id": None, "name": "g"}]
    assert len(Message.model_validate({"role": "assistant", "tool_calls": calls}).tool_calls) == 3
    tool = Message.model_validate({"role": "tool", "tool_call_id": "a", "is_error": True})
    assert tool.is_error


def test_a_sample_ingested_twice_gets_the_same_id() -> None:
    message = Message(role="user", content="hello")
    by_ref = [_minimal(message, source_ref="file-7:42") for _ in range(2)]
    assert by_ref[0].id == by_ref[1].id == derive_sample_id(TENANT, "upload", "file-7:42")
    by_content = [_minimal(message, created_at=_when() + timedelta(hours=h)) for h in range(2)]
    assert by_content[0].id == by_content[1].id != by_ref[0].id
    assert _minimal(message, id="explicit").id == "explicit"
    assert Sample.from_json_bytes(by_ref[0].to_json_bytes()).id == by_ref[0].id


def test_fingerprint_ignores_ids_times_and_formatting_but_not_content() -> None:
    def conversation(question: str, args: str, call_id: str) -> list[Message]:
        return [
            Message(role="user", content=question),
            Message(
                role="assistant", tool_calls=[ToolCall(id=call_id, name="lookup", arguments=args)]
            ),
            Message(role="tool", tool_call_id=call_id, content="ok"),
            Message(role="assistant", content="Done."),
        ]

    base = _minimal(*conversation("Café?", '{"q": "x", "n": 1}', "call_a"))
    same = Sample(
        tenant="other",
        source="gateway",
        source_ref="r9",
        created_at=_when() + timedelta(days=3),
        messages=conversation("  Cafe\u0301?\n", '{"n":1,"q":"x"}', "call_b"),
        params=RequestParams(temperature=0.2),
    )
    assert same.content_fingerprint() == base.content_fingerprint()
    assert len(base.content_fingerprint()) == 64

    different = [
        _minimal(*conversation("Tea?", '{"q": "x", "n": 1}', "call_a")),
        _minimal(*conversation("Café?", '{"q": "y", "n": 1}', "call_a")),
        _minimal(
            *conversation("Café?", '{"q": "x", "n": 1}', "call_a"), tools=[ToolDef(name="lookup")]
        ),
    ]
    fingerprints = {s.content_fingerprint() for s in different}
    assert base.content_fingerprint() not in fingerprints
    assert len(fingerprints) == 3

    other_answer = _minimal(
        *conversation("Café?", '{"q": "x", "n": 1}', "call_a")[:-1],
        Message(role="assistant", content="No."),
    )
    assert other_answer.content_fingerprint() != base.content_fingerprint()
    assert other_answer.prompt_fingerprint() == base.prompt_fingerprint()


# --- schema details ---------------------------------------------------------------------------


def test_message_text_joins_text_parts_only() -> None:
    message = Message(
        role="user",
        content=[
            TextPart(text="one"),
            ImagePart(url="https://example.com/a.png"),
            TextPart(text="two"),
        ],
    )
    assert message.text() == "one\ntwo"
    assert Message(role="assistant", refusal="I can't help with that.").text() == ""


def test_params_are_open_and_normalised() -> None:
    params = RequestParams.model_validate(
        {"temperature": 0.3, "stop": "END", "top_k": None, "safetySettings": [{"category": "X"}]}
    )
    assert params.stop == ["END"]
    assert params.model_extra == {"safetySettings": [{"category": "X"}]}
    sample = _minimal(Message(role="user", content="hi"), params=params)
    assert Sample.from_json_bytes(sample.to_json_bytes()).params == params


def test_created_at_is_stored_in_utc() -> None:
    sample = _minimal(
        Message(role="user", content="hi"),
        created_at=datetime(2025, 1, 1, 12, tzinfo=timezone(timedelta(hours=2))),
    )
    assert sample.created_at == datetime(2025, 1, 1, 10, tzinfo=UTC)
    assert sample.created_at.tzinfo is UTC


def test_metadata_keeps_scalar_types() -> None:
    metadata = {"team": "search", "retries": 2, "score": 0.5, "reviewed": True, "note": None}
    sample = _minimal(Message(role="user", content="hi"), metadata=metadata, tags=["prod"])
    again = Sample.from_json_bytes(sample.to_json_bytes())
    assert again.metadata == metadata
    assert type(again.metadata["reviewed"]) is bool


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("stop", "stop"),
        ("tool_calls", "tool_calls"),
        ("end_turn", "stop"),
        ("max_tokens", "length"),
        ("tool_use", "tool_calls"),
        ("refusal", "content_filter"),
        ("STOP", "stop"),
        ("MAX_TOKENS", "length"),
        ("SAFETY", "content_filter"),
        (1, "stop"),
        (2, "length"),
        ("tool_call", "tool_calls"),
        ("FAKE_NEW_FINISH_REASON", "other"),
        (None, None),
    ],
)
def test_finish_reasons_are_normalised(raw: str | int | None, expected: str | None) -> None:
    assert normalize_finish_reason(raw) == expected


def test_gemini_stop_with_function_calls_counts_as_tool_calls() -> None:
    assert normalize_finish_reason("STOP", has_tool_calls=True) == "tool_calls"


def test_error_paths_read_like_field_paths() -> None:
    assert (
        error_path(("messages", 0, "tool_calls", 1, "arguments"))
        == "messages[0].tool_calls[1].arguments"
    )
    assert (
        error_path(("messages", 2, "content", 1, "text", "text")) == "messages[2].content[1].text"
    )


# --- validation names the field ---------------------------------------------------------------


def _errors(**overrides: Any) -> list[str]:
    data: dict[str, Any] = {
        "tenant": TENANT,
        "source": "upload",
        "created_at": "2025-01-01T00:00:00Z",
        "messages": [{"role": "user", "content": "hi"}],
        **overrides,
    }
    with pytest.raises(ValidationError) as caught:
        Sample.model_validate(data)
    return describe_errors(caught.value)


def _one(*messages: dict[str, Any]) -> list[dict[str, Any]]:
    return list(messages)


@pytest.mark.parametrize(
    ("overrides", "path", "fragment"),
    [
        ({"messages": _one({"role": "model", "content": "x"})}, "messages[0].role", "'assistant'"),
        (
            {
                "messages": _one(
                    {
                        "role": "assistant",
                        "tool_calls": [{"name": "f"}, {"name": "g", "arguments": "{oops"}],
                    }
                )
            },
            "messages[0].tool_calls[1].arguments",
            "JSON",
        ),
        ({"created_at": "2025-01-01T00:00:00"}, "created_at", "timezone"),
        ({"created_at": datetime(2025, 1, 1)}, "created_at", "timezone"),
        (
            {
                "messages": _one(
                    {
                        "role": "user",
                        "content": [
                            {"type": "image", "url": "https://x/a.png", "ref": "s3://b/a.png"}
                        ],
                    }
                )
            },
            "messages[0].content[0]",
            "exactly one of ref, url, data; got ref, url",
        ),
        (
            {"messages": _one({"role": "user", "content": [{"type": "image"}]})},
            "messages[0].content[0]",
            "got none",
        ),
        (
            {
                "messages": _one(
                    {"role": "user", "content": [{"type": "image", "data": "iVBORw0KGgo="}]}
                )
            },
            "messages[0].content[0]",
            "mime_type",
        ),
        (
            {
                "messages": _one(
                    {
                        "role": "user",
                        "content": [
                            {"type": "image", "data": "not base64!", "mime_type": "image/png"}
                        ],
                    }
                )
            },
            "messages[0].content[0]",
            "base64",
        ),
        (
            {
                "messages": _one(
                    {
                        "role": "user",
                        "content": [{"type": "image", "ref": "https://x", "sha256": "0" * 64}],
                    }
                )
            },
            "messages[0].content[0]",
            "s3://",
        ),
        (
            {"messages": _one({"role": "user", "content": [{"type": "text", "text": None}]})},
            "messages[0].content[0].text",
            "string",
        ),
        (
            {"messages": _one({"role": "user", "content": [{"type": "video", "url": "x"}]})},
            "messages[0].content[0]",
            "video",
        ),
        (
            {"messages": _one({"role": "user", "contnet": "hi"})},
            "messages[0].contnet",
            "Extra inputs",
        ),
        ({"tag": ["x"]}, "tag", "Extra inputs"),
        (
            {"messages": _one({"role": "tool", "content": "42"})},
            "messages[0]",
            "tool_call_id or name",
        ),
        (
            {"messages": _one({"role": "user", "content": "x", "tool_calls": [{"name": "f"}]})},
            "messages[0]",
            "tool_calls is only allowed on assistant messages",
        ),
        (
            {"messages": _one({"role": "user", "content": "x", "tool_call_id": "c1"})},
            "messages[0]",
            "tool_call_id is only allowed on tool",
        ),
        ({"messages": []}, "messages", "at least 1"),
        ({"tenant": "acme corp"}, "tenant", "pattern"),
        ({"tenant": "Acme"}, "tenant", "pattern"),
        ({"schema_version": 2}, "schema_version", "not supported"),
        ({"response": {"provider": "openai", "status": "error"}}, "response", "error summary"),
        ({"response": {"provider": "mistral"}}, "response.provider", "'gemini'"),
        ({"tools": [{"name": "f"}, {"name": "f"}]}, "tools", "duplicate tool names: f"),
        ({"metadata": {"nested": {"a": 1}}}, "metadata", "'nested' must be"),
    ],
)
def test_validation_errors_name_the_field(
    overrides: dict[str, Any], path: str, fragment: str
) -> None:
    errors = _errors(**overrides)
    assert any(e.startswith(f"{path}:") and fragment in e for e in errors), errors


def test_typo_in_a_part_field_is_rejected() -> None:
    with pytest.raises(ValidationError) as caught:
        ImagePart.model_validate({"url": "https://x/a.png", "detial": "high"})
    assert describe_errors(caught.value) == ["detial: Extra inputs are not permitted"]

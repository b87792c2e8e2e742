"""Uploaded JSONL -> canonical samples: every format read faithfully, detection by its deciding
keys, bad lines rejected naming line and field while good ones are kept, and a byte stream split
into lines the same way whatever its chunking.

The log-format lines are built from the real recorded exchanges in the conformance fixtures and
must give exactly what the provider normalisers give for the same exchange.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.ingest.normalize import Dropped, Exchange, normalize
from services.ingest.uploads.formats import (
    ImportReport,
    Line,
    LineError,
    LineResult,
    LineSplitter,
    ParsedLine,
    UnknownFormat,
    aiter_lines,
    aparse_lines,
    detect_format,
    iter_lines,
    parse_line,
    parse_lines,
)
from shared.chat import ImagePart, Message, Sample, TextPart, ToolCall, ToolDef, derive_sample_id

TENANT = "acme"
FILE_ID = "file-abc123"
WHEN = datetime(2025, 8, 19, 14, 55, tzinfo=UTC)
Pair = dict[str, Any]


def parse(line: dict[str, Any] | bytes, *, number: int = 1, fmt: str = "auto") -> LineResult:
    data = line if isinstance(line, bytes) else orjson.dumps(line)
    return parse_line(
        data, line_number=number, tenant=TENANT, file_id=FILE_ID, format=fmt, created_at=WHEN
    )


def accepted(line: dict[str, Any] | bytes, **kwargs: Any) -> ParsedLine:
    result = parse(line, **kwargs)
    assert isinstance(result, ParsedLine), str(result)
    return result


def only_sample(line: dict[str, Any] | bytes, **kwargs: Any) -> Sample:
    (sample,) = accepted(line, **kwargs).samples
    return sample


def rejected(line: dict[str, Any] | bytes, **kwargs: Any) -> LineError:
    result = parse(line, **kwargs)
    assert isinstance(result, LineError), f"accepted: {result}"
    return result


def say(role: str, words: str, **fields: Any) -> Message:
    return Message.model_validate({"role": role, "content": [TextPart(text=words)], **fields})


# --- OpenAI fine-tuning -------------------------------------------------------------------------

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_current_weather",
        "description": "Get the current weather in a given location",
        "parameters": {
            "type": "object",
            "properties": {"location": {"type": "string"}},
            "required": ["location"],
        },
    },
}
FINETUNE_LINE = {
    "messages": [
        {"role": "system", "content": "You're a helpful assistant."},
        {"role": "user", "content": "What's the weather in Seattle today?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_JpNb8OiAkbIbHzDggfpdDHpi",
                    "type": "function",
                    "function": {
                        "name": "get_current_weather",
                        "arguments": '{"location": "Seattle, WA"}',
                    },
                }
            ],
            "weight": 0,
        },
        {
            "role": "tool",
            "tool_call_id": "call_JpNb8OiAkbIbHzDggfpdDHpi",
            "content": "50 degrees and raining",
        },
        {"role": "assistant", "content": "It is 50 degrees and raining in Seattle.", "weight": 1},
    ],
    "tools": [WEATHER_TOOL],
    "parallel_tool_calls": False,
}


def test_finetune_line_keeps_tools_tool_calls_and_weights() -> None:
    result = accepted(FINETUNE_LINE)
    (sample,) = result.samples
    assert result.format == "openai_finetune"
    assert result.dropped == []
    assert sample.messages == [
        say("system", "You're a helpful assistant."),
        say("user", "What's the weather in Seattle today?"),
        Message(
            role="assistant",
            tool_calls=[
                ToolCall(
                    id="call_JpNb8OiAkbIbHzDggfpdDHpi",
                    name="get_current_weather",
                    arguments='{"location": "Seattle, WA"}',
                )
            ],
            weight=0,
        ),
        say("tool", "50 degrees and raining", tool_call_id="call_JpNb8OiAkbIbHzDggfpdDHpi"),
        say("assistant", "It is 50 degrees and raining in Seattle.", weight=1),
    ]
    function = WEATHER_TOOL["function"]
    assert isinstance(function, dict)
    assert sample.tools == [ToolDef(**function)]
    assert sample.params.parallel_tool_calls is False
    assert sample.source == "upload"
    assert sample.source_ref == f"{FILE_ID}:1"
    assert sample.tenant == TENANT
    assert sample.created_at == WHEN
    assert sample.response is None
    assert sample.metadata == {"upload_format": "openai_finetune"}


def test_finetune_line_with_image_parts_developer_role_and_legacy_function_call() -> None:
    png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
    line = {
        "messages": [
            {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What's in this image?"},
                    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}},
                    {
                        "type": "image_url",
                        "image_url": {"url": "https://example.com/a.jpg", "detail": "low"},
                    },
                ],
            },
            {"role": "assistant", "function_call": {"name": "describe", "arguments": ""}},
            {"role": "function", "name": "describe", "content": "green"},
            {"role": "assistant", "content": "A green square."},
        ],
        "functions": [{"name": "describe", "parameters": {"type": "object"}}],
    }
    sample = only_sample(line)
    assert sample.messages[0] == say("system", "Be brief.")
    assert sample.messages[1].content == [
        TextPart(text="What's in this image?"),
        ImagePart(data=png, mime_type="image/png"),
        ImagePart(url="https://example.com/a.jpg", detail="low"),
    ]
    assert sample.messages[2].tool_calls == [ToolCall(name="describe", arguments="{}")]
    assert sample.messages[3] == say("tool", "green", name="describe")
    assert sample.tools == [ToolDef(name="describe", parameters={"type": "object"})]


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (
            {"messages": [{"role": "user", "content": "hi"}, {"role": "robot", "content": "x"}]},
            "messages[1].role: 'robot' is not one of system, user, assistant, tool",
        ),
        ({"messages": []}, "messages: needs at least one assistant message to train on"),
        (
            {"messages": [{"role": "user", "content": "hi"}]},
            "messages: needs at least one assistant message to train on",
        ),
        ({"messages": "hello"}, "messages: must be an array, not a string"),
        ({"messages": [{"content": "hi"}]}, "messages[0].role: is required"),
        (
            {"messages": [{"role": "user", "content": "hi", "weight": 1}]},
            "messages[0]: Value error, weight is only allowed on assistant messages, not user",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": "q"},
                    {"role": "assistant", "weight": 2, "content": "a"},
                ]
            },
            "messages[1].weight: Input should be 0 or 1",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": "q"},
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {"type": "function", "function": {"name": "f", "arguments": "{oops"}}
                        ],
                    },
                ]
            },
            "messages[1].tool_calls[0].function.arguments: Value error, arguments must be a JSON-encoded string",
        ),
        (
            {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": ""}]},
            "messages[1]: an assistant message needs content or tool_calls",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
            "messages[0].content[0].text: must be a string, not null",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": "q"},
                    {"role": "tool", "content": "r"},
                    {"role": "assistant", "content": "a"},
                ]
            },
            "messages[1]: Value error, a tool message needs tool_call_id or name",
        ),
        (
            {
                "messages": [{"role": "assistant", "content": "a"}],
                "tools": [{"type": "function", "function": {}}],
            },
            "tools[0].function.name: is required",
        ),
    ],
)
def test_finetune_rejections_name_the_field(line: dict[str, Any], reason: str) -> None:
    error = rejected(line, number=17)
    assert error.line_number == 17
    assert error.reason.startswith(reason), error.reason
    assert str(error).startswith(f"line 17: {reason}")


def test_finetune_unknown_keys_and_parts_are_noted_not_silently_dropped() -> None:
    line = {
        "messages": [
            {
                "role": "user",
                "content": [{"type": "video_url", "video_url": {}}, {"type": "text", "text": "q"}],
            },
            {"role": "assistant", "content": "a", "audio": {"id": "x"}},
        ],
        "id": "row-7",
    }
    result = accepted(line)
    assert result.dropped == [
        Dropped("messages[0].content[0].type", "unsupported content part type 'video_url'"),
        Dropped("messages[1].audio", "'audio' is not carried"),
        Dropped("id", "'id' is not carried"),
    ]


# --- ShareGPT -----------------------------------------------------------------------------------

SHAREGPT_LINE = {
    "conversations": [
        {"from": "human", "value": "What's the weather in Paris and Rome?"},
        {
            "from": "function_call",
            "value": json.dumps(
                [
                    {"name": "get_current_weather", "arguments": {"location": "Paris"}},
                    {"name": "get_current_weather", "arguments": {"location": "Rome"}},
                ]
            ),
        },
        {"from": "observation", "value": '{"temperature": 18}'},
        {"from": "observation", "value": '{"temperature": 24}'},
        {"from": "gpt", "value": "Paris is 18°C and Rome 24°C."},
        {"from": "human", "value": "And Oslo?"},
        {
            "from": "function_call",
            "value": '{"name": "get_current_weather", "arguments": "{\\"location\\": \\"Oslo\\"}"}',
        },
        {"from": "tool", "value": '{"temperature": 3}'},
        {"from": "gpt", "value": "Oslo is 3°C."},
    ],
    "system": "You are a weather bot.",
    "tools": json.dumps([WEATHER_TOOL["function"]]),
}


def test_sharegpt_maps_speakers_calls_and_observations() -> None:
    result = accepted(SHAREGPT_LINE)
    (sample,) = result.samples
    assert result.format == "sharegpt"
    weather = "get_current_weather"
    assert sample.messages == [
        say("system", "You are a weather bot."),
        say("user", "What's the weather in Paris and Rome?"),
        Message(
            role="assistant",
            tool_calls=[
                ToolCall(name=weather, arguments={"location": "Paris"}),
                ToolCall(name=weather, arguments={"location": "Rome"}),
            ],
        ),
        say("tool", '{"temperature": 18}', name=weather),
        say("tool", '{"temperature": 24}', name=weather),
        say("assistant", "Paris is 18°C and Rome 24°C."),
        say("user", "And Oslo?"),
        Message(
            role="assistant", tool_calls=[ToolCall(name=weather, arguments='{"location": "Oslo"}')]
        ),
        say("tool", '{"temperature": 3}', name=weather),
        say("assistant", "Oslo is 3°C."),
    ]
    assert [tool.name for tool in sample.tools] == [weather]
    assert sample.tools[0].parameters == WEATHER_TOOL["function"]["parameters"]  # type: ignore[index]


def test_sharegpt_system_turn_openai_wrapped_tools_and_from_value_messages() -> None:
    line = {
        "messages": [
            {"from": "system", "value": "Be kind."},
            {"from": "user", "value": "hi"},
            {"from": "assistant", "value": "hello"},
        ],
        "tools": [WEATHER_TOOL],
    }
    result = accepted(line)
    assert result.format == "sharegpt"
    assert result.samples[0].messages == [
        say("system", "Be kind."),
        say("user", "hi"),
        say("assistant", "hello"),
    ]
    assert result.samples[0].tools[0].name == "get_current_weather"


@pytest.mark.parametrize(
    ("turns", "reason"),
    [
        (
            [{"from": "robot", "value": "x"}],
            "conversations[0].from: 'robot' is not one of system, human, gpt, function_call, observation, tool",
        ),
        (
            [
                {"from": "human", "value": "q"},
                {"from": "observation", "value": "r"},
                {"from": "gpt", "value": "a"},
            ],
            "conversations[1]: a observation turn must answer a function_call turn before it",
        ),
        (
            [{"from": "human", "value": "q"}, {"from": "function_call", "value": "{not json"}],
            "conversations[1].value: is not valid JSON",
        ),
        (
            [
                {"from": "human", "value": "q"},
                {"from": "function_call", "value": '{"arguments": {}}'},
            ],
            "conversations[1].value.name: is required",
        ),
        ([{"from": "human", "value": 3}], "conversations[0].value: must be a string, not a number"),
        ([{"from": "human", "value": "q"}], "conversations: needs at least one assistant message"),
        (
            [{"from": "human", "value": "q"}, {"from": "gpt", "value": ""}],
            "conversations[1].value: must not be empty",
        ),
    ],
)
def test_sharegpt_rejections_name_the_field(turns: list[dict[str, Any]], reason: str) -> None:
    error = rejected({"conversations": turns})
    assert error.reason.startswith(reason), error.reason


# --- Alpaca -------------------------------------------------------------------------------------


def test_alpaca_with_input_history_and_system() -> None:
    line = {
        "instruction": "Translate to French.",
        "input": "Good morning",
        "output": "Bonjour",
        "system": "You are a translator.",
        "history": [["Translate to German: thank you", "Danke"]],
    }
    result = accepted(line)
    assert result.format == "alpaca"
    assert result.samples[0].messages == [
        say("system", "You are a translator."),
        say("user", "Translate to German: thank you"),
        say("assistant", "Danke"),
        say("user", "Translate to French.\n\nGood morning"),
        say("assistant", "Bonjour"),
    ]


def test_alpaca_with_empty_input_is_the_instruction_alone() -> None:
    sample = only_sample({"instruction": "Name a colour.", "input": "", "output": "Blue."})
    assert sample.messages == [say("user", "Name a colour."), say("assistant", "Blue.")]


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ({"instruction": "x"}, "output: is required"),
        ({"instruction": 5, "output": "y"}, "instruction: must be a string, not a number"),
        ({"instruction": "", "input": "", "output": "y"}, "instruction: must not be empty"),
        ({"instruction": "x", "output": ""}, "output: must not be empty"),
        (
            {"instruction": "x", "output": "y", "history": [["only one"]]},
            "history[0]: must be a [user, assistant] pair",
        ),
        (
            {"instruction": "x", "output": "y", "history": [["q", None]]},
            "history[0][1]: must be a string, not null",
        ),
    ],
)
def test_alpaca_rejections_name_the_field(line: dict[str, Any], reason: str) -> None:
    assert rejected(line).reason.startswith(reason)


# --- log formats, from the real recorded exchanges ----------------------------------------------


def _fixtures_dir() -> Path | None:
    candidates = [os.environ.get("TUNELOOP_FIXTURES_DIR")]
    candidates.append(str(Path(__file__).resolve().parents[5] / "shared" / "fixtures"))
    for candidate in candidates:
        if candidate and (Path(candidate) / "chat" / "derived").is_dir():
            return Path(candidate)
    return None


def _pairs() -> list[tuple[str, int, Pair]]:
    root = _fixtures_dir()
    if root is None:
        return []
    found = []
    for path in sorted((root / "chat" / "derived").glob("*.pairs.json")):
        for index, pair in enumerate(json.loads(path.read_text(encoding="utf-8"))):
            found.append((path.name.split("_")[0], index, pair))
    return found


PAIRS = _pairs()
PROVIDER_OF = {"oa": "openai", "an": "anthropic", "ge": "gemini"}


@pytest.fixture(scope="module", autouse=False)
def normalisers() -> None:
    for provider in ("openai", "anthropic", "gemini"):
        pytest.importorskip(f"services.ingest.normalize.{provider}")


def _need_fixtures() -> None:
    if not PAIRS:
        pytest.skip("conformance fixtures not found (set TUNELOOP_FIXTURES_DIR)")


def _direct(pair: Pair, provider: str, number: int = 1) -> list[Sample] | str:
    """What the provider normaliser makes of the exchange itself (or its error)."""
    body = pair["response"]["body"]
    model = (
        pair["request"]["uri"].split("models/")[-1].split(":")[0] if provider == "gemini" else None
    )
    exchange = Exchange(
        provider=provider,  # type: ignore[arg-type]
        request=pair["request"]["body"],
        status=pair["response"]["status"],
        response=body if isinstance(body, dict) else None,
        stream=body if isinstance(body, str) else None,
        model_from_path=model,
        tenant=TENANT,
        source="upload",
        source_ref=f"{FILE_ID}:{number}",
        created_at=WHEN,
        metadata={"upload_format": f"{provider}_log"},
    )
    try:
        return normalize(exchange).samples
    except ValueError as exc:
        return str(exc)


def _plain_line(pair: Pair, provider: str) -> dict[str, Any]:
    line = {
        "request": pair["request"]["body"],
        "response": pair["response"]["body"],
        "status": pair["response"]["status"],
    }
    if provider == "gemini":
        line["model"] = pair["request"]["uri"].split("models/")[-1].split(":")[0]
    return line


def _openpipe_line(pair: Pair, provider: str) -> dict[str, Any]:
    plain = _plain_line(pair, provider)
    return {
        "req": plain.pop("request"),
        "resp": plain.pop("response"),
        "statusCode": plain.pop("status"),
        **plain,
    }


def _http_record_line(pair: Pair, provider: str) -> dict[str, Any]:
    """The fixture entry as it is: `{request: {method, uri, body}, response: {status, body}}`."""
    return pair


SHAPES = {"plain": _plain_line, "openpipe": _openpipe_line, "http_record": _http_record_line}


@pytest.mark.usefixtures("normalisers")
@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize(("short", "index", "pair"), PAIRS, ids=[f"{s}-{i}" for s, i, _ in PAIRS])
def test_log_lines_give_what_the_normaliser_gives(
    short: str, index: int, pair: Pair, shape: str
) -> None:
    provider = PROVIDER_OF[short[:2]]
    expected = _direct(pair, provider)
    result = parse(SHAPES[shape](pair, provider))
    if isinstance(expected, str):
        # ge03 (a role Gemini rejects): the same reason, with the path into the line.
        assert isinstance(result, LineError)
        assert result.format == f"{provider}_log"
        request_at = {"plain": "request", "openpipe": "req", "http_record": "request.body"}[shape]
        assert result.reason == f"{request_at}.{expected}"
        return
    assert isinstance(result, ParsedLine), str(result)
    assert result.format == f"{provider}_log"
    assert [s.model_dump() for s in result.samples] == [s.model_dump() for s in expected]
    assert all(s.source == "upload" and s.source_ref == f"{FILE_ID}:1" for s in result.samples)


@pytest.mark.usefixtures("normalisers")
def test_log_line_with_a_stream_given_as_event_objects() -> None:
    _need_fixtures()
    (pair,) = [p for s, _, p in PAIRS if s == "oa03"]
    events = [
        json.loads(line.removeprefix("data: "))
        for line in pair["response"]["body"].splitlines()
        if line.startswith("data: {")
    ]
    as_text = accepted(_plain_line(pair, "openai"))
    as_events = accepted({**_plain_line(pair, "openai"), "response": events})
    assert as_events.samples == as_text.samples
    assert as_text.samples[0].messages[-1].tool_calls


@pytest.mark.usefixtures("normalisers")
def test_litellm_standard_logging_payload() -> None:
    _need_fixtures()
    (pair,) = [p for s, i, p in PAIRS if s == "oa01" and i == 0]
    body = dict(pair["request"]["body"])
    line = {
        "id": "litellm-1",
        "call_type": "acompletion",
        "model": body.pop("model"),
        "messages": body.pop("messages"),
        "model_parameters": body,
        "response": pair["response"]["body"],
        "status": "success",
        "response_cost": 0.0001,
    }
    result = accepted(line)
    assert result.format == "openai_log"
    expected = _direct(pair, "openai")
    assert isinstance(expected, list)
    assert [s.model_dump() for s in result.samples] == [s.model_dump() for s in expected]
    assert Dropped("call_type", "'call_type' is not carried") in result.dropped
    failed = accepted({**line, "status": "failure", "response": None, "error_str": "rate limited"})
    (sample,) = failed.samples
    assert sample.response is not None
    assert sample.response.status == "error"
    assert sample.response.error is not None
    assert sample.response.error.message == "rate limited"


def test_openai_responses_log_lines_plain_http_record_and_stream() -> None:
    request = {"model": "gpt-4.1", "instructions": "Be brief.", "input": "Capital of Peru?"}
    answer = {
        "id": "resp_1", "object": "response", "status": "completed", "model": "gpt-4.1-2025-04-14",
        "output": [{"type": "message", "role": "assistant",
                    "content": [{"type": "output_text", "text": "Lima.", "annotations": []}]}],
        "usage": {"input_tokens": 12, "output_tokens": 2, "total_tokens": 14},
    }  # fmt: skip
    plain = accepted({"request": request, "response": answer})
    assert plain.format == "openai_log"
    (sample,) = plain.samples
    assert [(m.role, m.text()) for m in sample.messages] == [
        ("system", "Be brief."),
        ("user", "Capital of Peru?"),
        ("assistant", "Lima."),
    ]
    http = accepted({
        "request": {"method": "POST", "uri": "https://api.openai.com/v1/responses", "body": request},
        "response": {"status": {"code": 200, "message": "OK"}, "body": answer},
    })  # fmt: skip
    assert [m.messages for m in http.samples] == [sample.messages]
    events = [
        {"type": "response.created", "response": answer | {"status": "in_progress", "output": []}},
        {"type": "response.completed", "response": answer},
    ]
    streamed = accepted({"request": request | {"stream": True}, "response": events})
    assert [m.messages for m in streamed.samples] == [sample.messages]
    cut = parse({"request": request, "response": events[:1]})
    assert isinstance(cut, LineError)
    assert "no response.completed event" in cut.reason


@pytest.mark.usefixtures("normalisers")
def test_log_errors_point_into_the_line() -> None:
    request = {
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": "hi"}, {"role": "robot"}],
    }
    response = {"object": "chat.completion", "choices": [{"index": 0, "message": {"content": "x"}}]}
    error = rejected({"request": request, "response": response}, number=4)
    # The path is ours (into the line); the words after it are the normaliser's.
    assert str(error).startswith("line 4: request.messages[1].role: ")
    error = rejected(
        {"request": {**request, "messages": request["messages"][:1]}, "response": {"choices": 3}}
    )
    assert error.reason.startswith("response.choices: ")
    error = rejected({"request": request, "response": response, "status": "ok"})
    assert error.reason == "status: must be an HTTP status code (100-599), not a string"


# --- detection ----------------------------------------------------------------------------------

OA_REQUEST = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
OA_RESPONSE = {
    "object": "chat.completion",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "yo"}}],
}
AN_REQUEST = {
    "model": "claude-3-5-haiku",
    "max_tokens": 10,
    "messages": [{"role": "user", "content": "hi"}],
}
AN_RESPONSE = {
    "type": "message",
    "role": "assistant",
    "content": [{"type": "text", "text": "yo"}],
    "stop_reason": "end_turn",
}
GE_REQUEST = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
GE_RESPONSE = {
    "candidates": [
        {"content": {"role": "model", "parts": [{"text": "yo"}]}, "finishReason": "STOP"}
    ]
}


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ({"messages": [{"role": "user", "content": "q"}]}, "openai_finetune"),
        ({"messages": [{"role": "user", "content": "q"}], "tools": []}, "openai_finetune"),
        ({"messages": [{"from": "human", "value": "q"}]}, "sharegpt"),
        ({"conversations": []}, "sharegpt"),
        ({"instruction": "x", "output": "y"}, "alpaca"),
        ({"request": OA_REQUEST, "response": OA_RESPONSE}, "openai_log"),
        ({"req": OA_REQUEST, "resp": OA_RESPONSE}, "openai_log"),
        (
            {"request": OA_REQUEST, "response": {"error": {"message": "no"}}, "status": 404},
            "openai_log",
        ),
        ({"request": OA_REQUEST, "response": None, "status": 500}, "openai_log"),
        (
            {"messages": OA_REQUEST["messages"], "response": OA_RESPONSE, "model": "gpt-4o"},
            "openai_log",
        ),
        ({"request": AN_REQUEST, "response": AN_RESPONSE}, "anthropic_log"),
        ({"request": {**AN_REQUEST, "system": "be nice"}, "response": None}, "anthropic_log"),
        (
            {
                "request": AN_REQUEST,
                "response": {"type": "error", "error": {"type": "overloaded_error"}},
            },
            "anthropic_log",
        ),
        (
            {"request": AN_REQUEST, "response": "event: message_start\ndata: {}\n\n"},
            "anthropic_log",
        ),
        ({"request": GE_REQUEST, "response": GE_RESPONSE}, "gemini_log"),
        (
            {
                "request": GE_REQUEST,
                "response": {"error": {"code": 400, "status": "INVALID_ARGUMENT"}},
            },
            "gemini_log",
        ),
        (
            {
                "request": {
                    "uri": "https://x/v1beta/models/gemini-2.0-flash:generateContent",
                    "body": {"contents": {}},
                },
                "response": {"status": 200, "body": GE_RESPONSE},
            },
            "gemini_log",
        ),
    ],
)
def test_detection_table(line: dict[str, Any], expected: str) -> None:
    assert detect_format(line).format == expected


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (
            {"foo": 1},
            "cannot tell the format: expected one of messages / conversations / instruction / request+response (the line has foo)",
        ),
        (
            {},
            "cannot tell the format: expected one of messages / conversations / instruction / request+response (the line has none)",
        ),
        (
            {"messages": [], "conversations": []},
            "cannot tell the format: the line has messages and conversations; pass a format to choose one",
        ),
        (
            {"instruction": "x", "output": "y", "conversations": []},
            "cannot tell the format: the line has conversations and instruction; pass a format to choose one",
        ),
        ({"request": OA_REQUEST}, "cannot tell the format: expected one of"),
        (
            {"request": GE_REQUEST, "response": OA_RESPONSE},
            "cannot tell the provider: the request has contents (gemini) but the response has choices (openai)",
        ),
        (
            {"request": {"prompt": "hi"}, "response": {}},
            "request: cannot tell the provider: expected messages (OpenAI, Anthropic), input (OpenAI "
            "Responses) or contents (Gemini)",
        ),
        ([1, 2], "must be a JSON object, not an array"),
    ],
)
def test_undecidable_lines_are_rejected_saying_why(line: Any, reason: str) -> None:
    error = rejected(orjson.dumps(line), number=9)
    assert error.reason.startswith(reason), error.reason
    assert error.format is None


def test_forced_format_that_does_not_fit_says_what_the_line_looks_like() -> None:
    error = rejected(SHAREGPT_LINE, fmt="openai_finetune")
    assert error.format == "openai_finetune"
    assert (
        error.reason == "messages: is required (the line looks like sharegpt: it has conversations)"
    )
    error = rejected({"instruction": "x", "output": "y"}, fmt="sharegpt")
    assert (
        error.reason
        == "conversations: is required (the line looks like alpaca: it has instruction)"
    )


@pytest.mark.usefixtures("normalisers")
def test_forced_log_provider_that_does_not_fit() -> None:
    error = rejected({"request": OA_REQUEST, "response": OA_RESPONSE}, fmt="gemini_log")
    assert error.reason.startswith("request.contents: ")
    assert error.reason.endswith("(the line looks like openai_log: the response has choices)")


def test_forced_format_settles_an_ambiguous_line() -> None:
    line = {**FINETUNE_LINE, "conversations": [{"from": "human", "value": "q"}]}
    assert rejected(line).reason.startswith("cannot tell the format")
    result = accepted(line, fmt="openai_finetune")
    assert Dropped("conversations", "'conversations' is not carried") in result.dropped


def test_unknown_format_is_a_bad_request_not_a_bad_line() -> None:
    with pytest.raises(UnknownFormat, match="unknown format 'csv': expected auto, openai_finetune"):
        parse({"messages": []}, fmt="csv")
    with pytest.raises(UnknownFormat):
        list(parse_lines([b"{}"], tenant=TENANT, file_id=FILE_ID, created_at=WHEN, format="csv"))


def test_json_and_utf8_problems_say_where() -> None:
    assert (
        rejected(b'{"messages": [1, x]}', number=3).reason
        == "not valid JSON (unexpected character, expected a JSON value at column 18)"
    )
    assert (
        str(rejected(b'{"a": 1, x}', number=3))
        == "line 3: not valid JSON (unexpected character, expected a string key at column 10)"
    )
    assert rejected(b'{"a": "caf\xe9"}').reason == "not valid UTF-8 (byte 0xe9 at offset 10)"


# --- identity -----------------------------------------------------------------------------------


def test_the_same_line_imported_twice_gives_the_same_ids() -> None:
    first = only_sample(FINETUNE_LINE, number=12)
    again = only_sample(FINETUNE_LINE, number=12)
    assert first.id == again.id == derive_sample_id(TENANT, "upload", f"{FILE_ID}:12")
    assert only_sample(FINETUNE_LINE, number=13).id != first.id
    other_file = parse_line(
        orjson.dumps(FINETUNE_LINE),
        line_number=12,
        tenant=TENANT,
        file_id="file-other",
        created_at=WHEN,
    )
    assert isinstance(other_file, ParsedLine)
    assert other_file.samples[0].id != first.id


# --- line splitting -----------------------------------------------------------------------------

ALPACA_LINE = {"instruction": "Say hi.", "output": "Hi!"}
MIXED_FILE = (
    b"\n".join(
        [
            orjson.dumps(FINETUNE_LINE),  # 1
            b"",  # 2: blank
            orjson.dumps(SHAREGPT_LINE),  # 3
            b'{"messages": [{"role": "robot", "content": "x"}]}',  # 4: bad role
            b"   ",  # 5: blank
            orjson.dumps(ALPACA_LINE),  # 6
            b'{"instruction": "x", "output": "y"',  # 7: truncated JSON
            b'{"hello": "world"}',  # 8: unknown format
            orjson.dumps({"instruction": "Count to 3.", "input": "", "output": "1, 2, 3"}),  # 9
        ]
    )
    + b"\n\n"
)  # 10: a trailing blank line


def chunked(data: bytes, size: int) -> Iterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


def run(data: bytes, size: int = 65536, **kwargs: Any) -> tuple[list[LineResult], ImportReport]:
    report = ImportReport()
    results = list(
        parse_lines(
            chunked(data, size),
            tenant=TENANT,
            file_id=FILE_ID,
            created_at=WHEN,
            report=report,
            **kwargs,
        )
    )
    return results, report


def summary(results: list[LineResult]) -> list[tuple[int, str, list[str]]]:
    return [
        (r.line_number, r.reason, [])
        if isinstance(r, LineError)
        else (r.line_number, r.format, [s.id for s in r.samples])
        for r in results
    ]


def test_mixed_file_keeps_good_lines_and_reports_bad_ones_by_number() -> None:
    results, report = run(MIXED_FILE)
    assert [r.line_number for r in results] == [1, 3, 4, 6, 7, 8, 9]
    assert [str(r) for r in results if isinstance(r, LineError)] == [
        "line 4: messages[0].role: 'robot' is not one of system, user, assistant, tool",
        "line 7: not valid JSON (unexpected end of data at column 35)",
        "line 8: cannot tell the format: expected one of messages / conversations / instruction / request+response (the line has hello)",
    ]
    body = orjson.loads(report.to_json())
    assert body == {
        "total_lines": 10,
        "blank_lines": 3,
        "accepted_lines": 4,
        "rejected_lines": 3,
        "samples": 4,
        "formats": {"openai_finetune": 1, "sharegpt": 1, "alpaca": 2},
        "errors": [
            {
                "line": 4,
                "reason": "messages[0].role: 'robot' is not one of system, user, assistant, tool",
                "format": "openai_finetune",
            },
            {
                "line": 7,
                "reason": "not valid JSON (unexpected end of data at column 35)",
                "format": None,
            },
            {"line": 8, "reason": body["errors"][2]["reason"], "format": None},
        ],
        "errors_truncated": False,
        "errors_url": None,  # the caller sets it where it keeps the complete list
        "dropped": {},
        "status_details": "4 of 7 lines accepted (4 samples); 3 rejected (first: line 4: messages[0].role: 'robot' is not one of system, user, assistant, tool).",
    }


@pytest.mark.parametrize("size", [1, 7, 65536])
def test_chunking_does_not_change_the_results(size: int) -> None:
    whole, _ = run(MIXED_FILE, size=len(MIXED_FILE))
    assert summary(run(MIXED_FILE, size=size)[0]) == summary(whole)


def test_async_reader_gives_what_the_sync_one_gives() -> None:
    async def body() -> AsyncIterator[bytes]:
        for chunk in chunked(MIXED_FILE, 7):
            await asyncio.sleep(0)
            yield chunk

    async def collect() -> tuple[list[LineResult], list[Line | LineError], ImportReport]:
        report = ImportReport()
        results = [
            r
            async for r in aparse_lines(
                body(), tenant=TENANT, file_id=FILE_ID, created_at=WHEN, report=report
            )
        ]
        lines = [line async for line in aiter_lines(chunked(MIXED_FILE, 3))]
        return results, lines, report

    results, lines, report = asyncio.run(collect())
    sync_results, sync_report = run(MIXED_FILE)
    assert summary(results) == summary(sync_results)
    assert report.to_dict() == sync_report.to_dict()
    assert lines == list(iter_lines([MIXED_FILE]))


def test_crlf_bom_blank_lines_and_a_last_line_without_newline() -> None:
    lf = list(iter_lines([b'{"a": 1}\n\n{"b": 2}\n{"c": 3}']))
    assert lf == [Line(1, b'{"a": 1}'), Line(3, b'{"b": 2}'), Line(4, b'{"c": 3}')]
    crlf = b'\xef\xbb\xbf{"a": 1}\r\n\r\n{"b": 2}\r\n{"c": 3}'
    for size in (1, 2, 5, 100):
        assert list(iter_lines(chunked(crlf, size))) == lf
    assert list(iter_lines([b"\n \t\r\n\n"])) == []
    assert list(iter_lines([])) == []
    # A BOM anywhere but the start of line 1 is content (and then bad JSON).
    assert list(iter_lines([b"{}\n\xef\xbb\xbf{}\n"])) == [
        Line(1, b"{}"),
        Line(2, b"\xef\xbb\xbf{}"),
    ]


def test_crlf_file_gives_the_same_results_as_lf() -> None:
    crlf = MIXED_FILE.replace(b"\n", b"\r\n")
    assert summary(run(b"\xef\xbb\xbf" + crlf, size=7)[0]) == summary(run(MIXED_FILE)[0])


def test_oversize_line_is_rejected_without_buffering_it() -> None:
    limit = 64
    splitter = LineSplitter(limit)
    out: list[Line | LineError] = []
    out += splitter.feed(b'{"a": 1}\n' + b"x" * 10)
    for _ in range(1000):
        out += splitter.feed(b"y" * 1000)
        assert splitter.buffered <= limit + 1
    out += splitter.feed(b'\n{"b": 2}\n' + b"z" * 100)
    out += splitter.close()
    assert out == [
        Line(1, b'{"a": 1}'),
        LineError(2, "line is longer than the limit of 64 bytes"),
        Line(3, b'{"b": 2}'),
        LineError(4, "line is longer than the limit of 64 bytes"),
    ]
    # Exactly at the limit is fine, with either line ending.
    exact = b"q" * limit
    assert list(iter_lines([exact + b"\r\n" + exact + b"\n" + exact], max_line_bytes=limit)) == [
        Line(1, exact),
        Line(2, exact),
        Line(3, exact),
    ]
    assert list(iter_lines([exact + b"qq\r\n"], max_line_bytes=limit)) == [
        LineError(1, "line is longer than the limit of 64 bytes")
    ]


def test_oversize_line_in_an_upload_is_one_rejection() -> None:
    data = (
        orjson.dumps(ALPACA_LINE)
        + b"\n"
        + orjson.dumps({"instruction": "x" * 500, "output": "y"})
        + b"\n"
        + orjson.dumps(ALPACA_LINE)
    )
    results, report = run(data, size=7, max_line_bytes=200)
    assert [(r.line_number, type(r).__name__) for r in results] == [
        (1, "ParsedLine"),
        (2, "LineError"),
        (3, "ParsedLine"),
    ]
    assert report.errors == [LineError(2, "line is longer than the limit of 200 bytes")]


def test_an_upload_is_read_as_it_streams_not_after() -> None:
    """An endless body still gives its first results: nothing waits for the whole file."""

    def endless() -> Iterator[bytes]:
        line = orjson.dumps(ALPACA_LINE) + b"\n"
        while True:
            yield line * 3

    results = parse_lines(endless(), tenant=TENANT, file_id=FILE_ID, created_at=WHEN)
    first = list(itertools.islice(results, 5))
    assert [r.line_number for r in first] == [1, 2, 3, 4, 5]


def test_a_bug_in_a_reader_costs_one_line_not_the_upload(monkeypatch: pytest.MonkeyPatch) -> None:
    from services.ingest.uploads.formats import parse as parse_module

    def broken(line: dict[str, Any], notes: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setitem(parse_module._CHAT_PARSERS, "sharegpt", broken)
    results, report = run(MIXED_FILE)
    assert [r.line_number for r in results if isinstance(r, ParsedLine)] == [1, 6, 9]
    assert LineError(3, "internal error while reading this line (logged)") in report.errors


# --- the report ---------------------------------------------------------------------------------


def test_report_caps_listed_errors_but_counts_them_all_and_hands_on_each() -> None:
    every: list[LineError] = []
    report = ImportReport(max_listed_errors=2, on_error=every.append)
    for number in range(1, 6):
        report.add(LineError(number, "bad"))
    assert report.rejected_lines == 5
    assert [e.line_number for e in report.errors] == [1, 2]
    assert report.to_dict()["errors_truncated"] is True
    assert [e.line_number for e in every] == [1, 2, 3, 4, 5]


def test_report_counts_dropped_parts_by_kind() -> None:
    line = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "video_url"},
                    {"type": "text", "text": "q"},
                    {"type": "video_url"},
                ],
            },
            {"role": "assistant", "content": "a"},
        ]
    }
    report = ImportReport(max_drop_kinds=2)
    report.add(accepted(line))
    report.add(accepted({**line, "id": 1}))
    report.add(accepted({**line, "source": "x"}))
    assert report.to_dict()["dropped"] == {
        "messages[].content[].type: unsupported content part type 'video_url'": 6,
        "id: 'id' is not carried": 1,
        "(other reasons)": 1,
    }


# --- fuzz ---------------------------------------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=20,
)
KEYS = [
    "role",
    "content",
    "name",
    "tool_calls",
    "tool_call_id",
    "weight",
    "function",
    "arguments",
    "type",
    "text",
    "image_url",
    "url",
    "from",
    "value",
    "id",
    "refusal",
    "function_call",
    "parts",
]
small_objects = st.dictionaries(
    st.sampled_from(KEYS),
    json_values
    | st.sampled_from(
        [
            "user",
            "assistant",
            "tool",
            "system",
            "human",
            "gpt",
            "function_call",
            "observation",
            "text",
            "image_url",
            "function",
            "{}",
            '{"name": "f"}',
        ]
    ),
    max_size=5,
)
shaped_lines = st.one_of(
    st.fixed_dictionaries(
        {"messages": st.lists(small_objects, max_size=4)},
        optional={"tools": json_values, "parallel_tool_calls": json_values},
    ),
    st.fixed_dictionaries(
        {"conversations": st.lists(small_objects, max_size=4)},
        optional={"system": json_values, "tools": json_values},
    ),
    st.fixed_dictionaries(
        {"instruction": json_values, "output": json_values},
        optional={"input": json_values, "history": json_values, "system": json_values},
    ),
    st.fixed_dictionaries(
        {
            "request": st.fixed_dictionaries(
                {"messages": st.lists(small_objects, max_size=3)},
                optional={"model": json_values, "system": json_values, "contents": json_values},
            ),
            "response": json_values
            | st.fixed_dictionaries(
                {"choices": st.lists(st.fixed_dictionaries({"message": small_objects}), max_size=2)}
            ),
        },
        optional={"status": json_values, "model": json_values},
    ),
    st.fixed_dictionaries(
        {
            "request": st.fixed_dictionaries({"contents": st.lists(small_objects, max_size=3)}),
            "response": json_values,
        }
    ),
    st.fixed_dictionaries(
        {
            "request": st.fixed_dictionaries(
                {"messages": st.lists(small_objects, max_size=3), "max_tokens": st.just(5)}
            ),
            "response": st.fixed_dictionaries(
                {"type": st.just("message"), "content": st.lists(small_objects, max_size=2)}
            ),
        }
    ),
)
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _check(result: LineResult, fmt: str = "auto") -> None:
    if isinstance(result, LineError):
        assert "internal error" not in result.reason, result.reason
        assert result.reason
        return
    assert result.samples
    for sample in result.samples:
        assert Sample.from_json_bytes(sample.to_json_bytes()) == sample
        assert sample.source == "upload"
        assert sample.source_ref == f"{FILE_ID}:1"


@FUZZ
@given(value=json_values)
def test_fuzz_any_json_value(value: Any) -> None:
    _check(parse(orjson.dumps(value)))


@FUZZ
@given(
    line=shaped_lines,
    fmt=st.sampled_from(
        [
            "auto",
            "openai_finetune",
            "sharegpt",
            "alpaca",
            "openai_log",
            "anthropic_log",
            "gemini_log",
        ]
    ),
)
def test_fuzz_lines_shaped_like_each_format(line: dict[str, Any], fmt: str) -> None:
    _check(parse(line, fmt=fmt), fmt)


@FUZZ
@given(data=st.binary(max_size=200))
def test_fuzz_any_bytes(data: bytes) -> None:
    _check(parse(data))


@FUZZ
@given(data=st.binary(max_size=300), sizes=st.lists(st.integers(1, 40), min_size=1, max_size=10))
def test_fuzz_splitting_is_independent_of_chunking(data: bytes, sizes: list[int]) -> None:
    chunks, start, i = [], 0, 0
    while start < len(data):
        size = sizes[i % len(sizes)]
        chunks.append(data[start : start + size])
        start, i = start + size, i + 1
    assert list(iter_lines(chunks, max_line_bytes=50)) == list(
        iter_lines([data], max_line_bytes=50)
    )

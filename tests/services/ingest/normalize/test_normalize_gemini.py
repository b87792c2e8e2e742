"""Gemini generateContent / streamGenerateContent -> canonical samples: every recorded request,
response and stream becomes the right sample (or is rejected naming the field or line), both
spellings and shapes of the REST API are read, and no input makes the normaliser fail with
anything but a NormalizeError."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.ingest.normalize import Exchange, Normalized, NormalizeError
from services.ingest.normalize.gemini import normalize
from shared.chat import ImagePart, TextPart
from tests.services.ingest.normalize.normalize_cases import (
    Case,
    Expectation,
    Rejected,
    cases,
    check_against_hand_built,
    check_case,
    hand_built,
    json_values,
    mutated,
    normalize_or_reject,
    recorded,
)

# --- every recorded exchange ---------------------------------------------------------------------


def _only(result: Normalized) -> Any:
    (sample,) = result.samples
    return sample


def _ge01_int_enums_and_no_ids(case: Case, result: Normalized) -> None:
    sample = _only(result)
    assert [m.role for m in sample.messages] == ["user", "assistant", "tool", "tool", "assistant"]
    calls = sample.messages[1].tool_calls
    assert [(c.id, c.parse_arguments()) for c in calls] == [
        (None, {"location": "New Delhi"}),
        (None, {"location": "San Francisco"}),
    ]
    results = sample.messages[2:4]
    assert [(m.name, m.tool_call_id) for m in results] == [("get_current_weather", None)] * 2
    recorded = case.raw["request"]["contents"][2]["parts"][0]["functionResponse"]["response"]
    assert json.loads(results[0].text()) == recorded
    # Vertex's integer enum types (6 = OBJECT, 1 = STRING) as JSON Schema names.
    (tool,) = sample.tools
    assert tool.parameters["type"] == "object"
    assert tool.parameters["properties"]["location"]["type"] == "string"
    assert "propertyOrdering" not in tool.parameters
    assert result.dropped == []
    answer = sample.completion()
    signature = case.raw["response"]["candidates"][0]["content"]["parts"][0]["thoughtSignature"]
    assert [(b.text, b.signature) for b in answer.reasoning] == [("", signature)]
    assert "35°C" in answer.text()
    meta = sample.response
    assert (meta.finish_reason, meta.finish_reason_raw) == ("stop", 1)
    assert meta.model_requested == "gemini-2.5-pro"
    assert meta.response_id == "ZZCkaLnDCuavgLUP4fGpsQs"
    usage = meta.usage
    assert (usage.input_tokens, usage.output_tokens, usage.reasoning_tokens) == (128, 26 + 692, 692)
    assert usage.total_tokens == 846


def _ge02_file_and_mislabelled_inline(case: Case, result: Normalized) -> None:
    sample = _only(result)
    text, remote, inline = sample.messages[0].content
    assert isinstance(text, TextPart)
    assert isinstance(remote, ImagePart)
    assert isinstance(inline, ImagePart)
    file_data = case.raw["request"]["contents"][0]["parts"][1]["fileData"]
    assert (remote.url, remote.mime_type) == (file_data["fileUri"], "image/jpeg")
    # Labelled image/jpeg, but the bytes are PNG.
    assert inline.mime_type == "image/png"
    assert base64.b64decode(inline.data or "")[:4] == b"\x89PNG"
    (note,) = result.dropped
    assert note.path == "contents[0].parts[2].inlineData.mimeType"
    assert "image/png" in note.reason


def _ge04_url_safe_stream(case: Case, result: Normalized) -> None:
    sample = _only(result)
    system, user, answer = sample.messages
    assert system.role == "system"
    assert system.text().startswith("You are a helpful assistant")
    image = user.content[1]
    assert isinstance(image, ImagePart)
    recorded = case.raw["request"]["contents"][0]["parts"][1]["inlineData"]["data"]
    assert "-" in recorded
    assert "_" in recorded
    assert image.data is not None
    assert "-" not in image.data
    assert "_" not in image.data
    assert base64.b64decode(image.data or "") == base64.urlsafe_b64decode(recorded)
    chunks = [json.loads(line[6:]) for line in case.raw["response"].split("\r\n\r\n") if line]
    assert answer.text() == "".join(
        c["candidates"][0]["content"]["parts"][0]["text"] for c in chunks
    )
    meta = sample.response
    assert meta.finish_reason == "stop"
    assert meta.model_requested == "gemini-2.5-flash"
    # The last chunk's usage, with thoughts counted as output.
    assert (meta.usage.input_tokens, meta.usage.output_tokens, meta.usage.total_tokens) == (
        277,
        124 + 570,
        971,
    )
    assert sample.params.stream is True


def _ge05_call(case: Case, result: Normalized) -> None:
    sample = _only(result)
    (call,) = sample.completion().tool_calls
    assert (call.id, call.name, call.parse_arguments()) == (
        None,
        "get_weather",
        {"location": "San Francisco"},
    )
    # Gemini says STOP even when the answer is a call.
    assert (sample.response.finish_reason, sample.response.finish_reason_raw) == (
        "tool_calls",
        "STOP",
    )
    (tool,) = sample.tools
    assert tool.parameters == {
        "properties": {
            "location": {"type": "string"},
            "unit": {"default": "fahrenheit", "type": "string"},
        },
        "required": ["location"],
        "type": "object",
    }


def _ge05_result(case: Case, result: Normalized) -> None:
    sample = _only(result)
    tool_message = sample.messages[3]
    assert (tool_message.role, tool_message.name) == ("tool", "get_weather")
    assert json.loads(tool_message.text())["result"]["condition"] == "foggy"
    assert sample.completion().text().startswith("The weather in San Francisco is foggy")


def _ge06_snake_case_singular(case: Case, result: Normalized) -> None:
    sample = _only(result)
    system, user, answer = sample.messages
    assert system.text().startswith("You are a helpful lighting system bot.")
    assert (user.role, user.text()) == ("user", "Turn on the lights please.")
    assert [(t.name, t.parameters is None) for t in sample.tools] == [
        ("enable_lights", True),
        ("set_light_color", False),
        ("stop_lights", True),
    ]
    assert sample.tools[1].parameters["required"] == ["rgb_hex"]
    assert sample.params.tool_choice == "auto"
    assert answer.tool_calls[0].arguments == "{}"


def _call_args(*expected: dict[str, Any]) -> Callable[[Case, Normalized], None]:
    def check(case: Case, result: Normalized) -> None:
        answer = _only(result).completion()
        assert [c.id for c in answer.tool_calls] == [None] * len(expected)
        assert [c.parse_arguments() for c in answer.tool_calls] == list(expected)

    return check


def _gr01_null_arg(case: Case, result: Normalized) -> None:
    _call_args({"original_title": "String", "season": None})(case, result)
    assert '"season": null' in _only(result).completion().tool_calls[0].arguments


def _gr02_no_args_no_usage(case: Case, result: Normalized) -> None:
    _call_args({})(case, result)
    assert _only(result).response.usage is None


def _gr04_blocked_prompt(case: Case, result: Normalized) -> None:
    sample = _only(result)
    assert sample.completion() is None
    assert [m.role for m in sample.messages] == ["user"]
    meta = sample.response
    assert (meta.status, meta.finish_reason, meta.finish_reason_raw) == (
        "error",
        "content_filter",
        "SAFETY",
    )
    assert (meta.error.type, meta.error.code) == ("prompt_blocked", "SAFETY")


def _gr05_empty_content(case: Case, result: Normalized) -> None:
    sample = _only(result)
    # An empty candidate is no answer: the prompt only, not an empty assistant turn.
    assert sample.completion() is None
    assert (sample.response.status, sample.response.finish_reason) == ("ok", None)


def _gr06_empty_part_and_image_output(case: Case, result: Normalized) -> None:
    answer = _only(result).completion()
    text, image = answer.content
    assert isinstance(text, TextPart)
    assert text.text.startswith("I can certainly help")
    assert isinstance(image, ImagePart)
    assert image.mime_type == "image/png"
    assert [(d.path, d.reason) for d in result.dropped] == [
        ("response.candidates[0].content.parts[1]", "empty part")
    ]
    assert _only(result).response.model == "gemini-2.5-flash-image-preview"


def _gr07_unknown_finish(case: Case, result: Normalized) -> None:
    sample = _only(result)
    assert sample.completion().text() == "Some text"
    assert (sample.response.finish_reason, sample.response.finish_reason_raw) == (
        "other",
        "FAKE_NEW_FINISH_REASON",
    )


def _gr09_safety_without_content(case: Case, result: Normalized) -> None:
    sample = _only(result)
    assert sample.completion() is None
    meta = sample.response
    assert (meta.status, meta.finish_reason, meta.finish_reason_raw) == (
        "ok",
        "content_filter",
        "SAFETY",
    )
    assert (meta.usage.input_tokens, meta.usage.output_tokens) == (8, None)


EXPECTED: dict[str, Expectation] = {
    "ge01#0": _ge01_int_enums_and_no_ids,
    "ge02#0": _ge02_file_and_mislabelled_inline,
    # The recorded 400 notwithstanding: the request itself cannot be a sample.
    "ge03#0": Rejected("contents[0].role", "invalid role 'invalid_role'"),
    "ge04#0": _ge04_url_safe_stream,
    "ge05#0": _ge05_call,
    "ge05#1": _ge05_result,
    "ge06#0": _ge06_snake_case_singular,
    "gr01#0": _gr01_null_arg,
    "gr02#0": _gr02_no_args_no_usage,
    "gr03#0": _call_args({"y": 1, "x": 2}, {"y": 3, "x": 4}, {"y": 5, "x": 6}),
    "gr04#0": _gr04_blocked_prompt,
    "gr05#0": _gr05_empty_content,
    "gr06#0": _gr06_empty_part_and_image_output,
    "gr07#0": _gr07_unknown_finish,
    "gr08#0": Rejected("stream line 1", "not a GenerateContentResponse"),
    "gr09#0": _gr09_safety_without_content,
}


@pytest.mark.parametrize("case", cases("gemini"))
def test_recorded_exchange_becomes_the_right_sample(case: Case) -> None:
    assert case.key in EXPECTED, f"no expected outcome written down for {case.key}"
    check_case(case, EXPECTED[case.key])


@pytest.mark.parametrize("short", hand_built("ge"))
def test_agrees_with_the_samples_the_schema_tests_build_by_hand(short: str) -> None:
    check_against_hand_built(short)


# --- shapes the recordings do not show -----------------------------------------------------------

REQUEST: dict[str, Any] = {"contents": [{"role": "user", "parts": [{"text": "Hi"}]}]}
ANSWER: dict[str, Any] = {
    "candidates": [
        {"content": {"role": "model", "parts": [{"text": "Hello"}]}, "finishReason": "STOP"}
    ],
    "usageMetadata": {"promptTokenCount": 2, "candidatesTokenCount": 1, "totalTokenCount": 3},
}


def _run(request: Any = None, response: Any = None, **fields: Any) -> Normalized:
    exchange = Exchange(
        provider="gemini",
        request=REQUEST if request is None else request,
        response=ANSWER if response is None and "stream" not in fields else response,
        model_from_path="gemini-2.5-flash",
        **fields,
    )
    return normalize(exchange)


def test_snake_case_parts_generation_config_and_tool_config() -> None:
    request = {
        "contents": [
            {
                "role": "user",
                "parts": [{"inline_data": {"mime_type": "image/png", "data": "iVBORw0KGgo="}}],
            },
            {"role": "model", "parts": [{"function_call": {"name": "f", "args": {"a": 1}}}]},
            {
                "role": "user",
                "parts": [{"function_response": {"name": "f", "response": {"ok": True}}}],
            },
        ],
        "generation_config": {
            "max_output_tokens": 64,
            "stopSequences": ["x"],
            "thinkingConfig": {"thinkingBudget": 0},
        },
        "tool_config": {
            "function_calling_config": {"mode": "ANY", "allowed_function_names": ["f"]}
        },
        "safetySettings": [{"category": "HARM_CATEGORY_HATE_SPEECH", "threshold": "BLOCK_NONE"}],
    }
    (sample,) = _run(request).samples
    assert isinstance(sample.messages[0].content[0], ImagePart)
    assert sample.messages[1].tool_calls[0].arguments == '{"a": 1}'
    assert sample.messages[2].text() == '{"ok": true}'
    assert (sample.params.max_tokens, sample.params.stop) == (64, ["x"])
    assert sample.params.tool_choice == {"type": "function", "function": {"name": "f"}}
    assert set(sample.params.model_extra or {}) == {"thinking_config", "safety_settings"}


def test_thought_parts_become_reasoning_and_candidates_become_samples() -> None:
    response = {
        "candidates": [
            {
                "index": 0,
                "content": {"parts": [{"text": "hmm", "thought": True}, {"text": "A"}]},
                "finishReason": "STOP",
            },
            {"index": 1, "content": {"parts": [{"text": "B"}]}, "finishReason": 2},
        ]
    }
    first, second = _run(response=response).samples
    assert [b.text for b in first.messages[-1].reasoning] == ["hmm"]
    assert first.messages[-1].text() == "A"
    assert second.response is not None
    assert (second.response.choice_index, second.response.finish_reason) == (1, "length")


def test_stream_chunks_merge_text_and_keep_calls_and_last_usage() -> None:
    chunks = [
        {"candidates": [{"content": {"role": "model", "parts": [{"text": "Let me "}]}}]},
        {
            "candidates": [
                {"content": {"parts": [{"text": "check."}, {"functionCall": {"name": "f"}}]}}
            ]
        },
        {
            "candidates": [{"finishReason": "STOP"}],
            "usageMetadata": {"promptTokenCount": 5, "candidatesTokenCount": 9},
        },
    ]
    stream = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks)
    for body in (stream, json.dumps(chunks)):  # `alt=sse`, and the JSON-array form
        (sample,) = _run(stream=body).samples
        answer = sample.completion()
        assert answer is not None
        assert answer.text() == "Let me check."
        assert [c.name for c in answer.tool_calls] == ["f"]
        assert sample.response is not None
        assert sample.response.finish_reason == "tool_calls"
        assert sample.response.usage is not None
        assert sample.response.usage.output_tokens == 9


def test_schema_types_nullable_and_an_unknown_type() -> None:
    declaration = {
        "name": "f",
        "parameters": {
            "type": "OBJECT",
            "properties": {
                "n": {"type": "INTEGER", "nullable": True},
                "xs": {"type": 5, "items": {"type": "NUMBER"}},
            },
        },
    }
    (sample,) = _run({**REQUEST, "tools": [{"functionDeclarations": [declaration]}]}).samples
    assert sample.tools[0].parameters == {
        "type": "object",
        "properties": {
            "n": {"type": ["integer", "null"]},
            "xs": {"type": "array", "items": {"type": "number"}},
        },
    }
    declaration["parameters"]["properties"]["n"]["type"] = 42  # type: ignore[index]
    with pytest.raises(NormalizeError) as info:
        _run({**REQUEST, "tools": [{"functionDeclarations": [declaration]}]})
    assert info.value.path == "tools[0].functionDeclarations[0].parameters.properties.n.type"


@pytest.mark.parametrize(
    ("request_body", "path"),
    [
        ({"contents": [{"role": "system", "parts": [{"text": "x"}]}]}, "contents[0].role"),
        ({"contents": []}, "contents"),
        (
            {"contents": [{"parts": [{"inlineData": {"mimeType": "image/png", "data": "@@@"}}]}]},
            "contents[0].parts[0].inlineData.data",
        ),
        (
            {"contents": [{"role": "user", "parts": [{"functionCall": {"name": "f"}}]}]},
            "contents[0].parts[0].functionCall",
        ),
        (
            {"contents": [{"parts": [{"functionResponse": {"response": {}}}]}]},
            "contents[0].parts[0].functionResponse.name",
        ),
    ],
)
def test_bad_requests_are_rejected_naming_the_field(
    request_body: dict[str, Any], path: str
) -> None:
    with pytest.raises(NormalizeError) as info:
        _run(request_body)
    assert info.value.path == path


def test_an_error_response_keeps_the_status_name() -> None:
    body = {"error": {"code": 429, "message": "Resource exhausted", "status": "RESOURCE_EXHAUSTED"}}
    (sample,) = _run(response=body, status=429).samples
    assert sample.response is not None
    assert sample.response.error is not None
    assert (sample.response.error.status_code, sample.response.error.type) == (
        429,
        "RESOURCE_EXHAUSTED",
    )


# --- fuzzing -------------------------------------------------------------------------------------

_FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_FUZZ
@given(
    field=st.sampled_from(
        [
            "contents",
            "systemInstruction",
            "tools",
            "toolConfig",
            "generationConfig",
            "system_instruction",
        ]
    ),
    value=json_values,
)
def test_any_json_at_a_request_field_is_a_sample_or_a_normalize_error(
    field: str, value: Any
) -> None:
    normalize_or_reject(
        Exchange(provider="gemini", request={**REQUEST, field: value}, response=ANSWER)
    )


@_FUZZ
@given(parts=st.lists(json_values, max_size=3), role=st.sampled_from(["user", "model"]))
def test_any_parts_are_a_sample_or_a_normalize_error(parts: list[Any], role: str) -> None:
    request = {
        "contents": [{"role": "user", "parts": [{"text": "x"}]}, {"role": role, "parts": parts}]
    }
    normalize_or_reject(Exchange(provider="gemini", request=request, response=ANSWER))


@_FUZZ
@given(
    field=st.sampled_from(
        ["candidates", "usageMetadata", "promptFeedback", "modelVersion", "error"]
    ),
    value=json_values,
)
def test_any_json_in_the_response_is_a_sample_or_a_normalize_error(field: str, value: Any) -> None:
    normalize_or_reject(
        Exchange(provider="gemini", request=REQUEST, response={**ANSWER, field: value})
    )


@_FUZZ
@given(chunks=st.lists(json_values, max_size=4), json_array=st.booleans())
def test_any_stream_is_a_sample_or_a_normalize_error(chunks: list[Any], json_array: bool) -> None:
    stream = (
        json.dumps(chunks)
        if json_array
        else "".join(f"data: {json.dumps(c)}\r\n\r\n" for c in chunks)
    )
    normalize_or_reject(Exchange(provider="gemini", request=REQUEST, stream=stream))


@_FUZZ
@given(data=st.data())
def test_a_recorded_exchange_changed_anywhere_is_a_sample_or_a_normalize_error(
    data: st.DataObject,
) -> None:
    case = data.draw(st.sampled_from(recorded("gemini")))
    normalize_or_reject(mutated(case, data))

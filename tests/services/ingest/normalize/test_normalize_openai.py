"""OpenAI Chat Completions -> canonical samples: every recorded exchange becomes the right
samples (or is rejected naming the field), streams reassemble exactly, and no input makes the
normaliser fail with anything but a NormalizeError."""

from __future__ import annotations

import base64
import hashlib
import json
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.ingest.normalize import Exchange, Normalized, NormalizeError
from services.ingest.normalize.openai import normalize
from shared.chat import ImagePart, TextPart
from tests.services.ingest.normalize.normalize_cases import (
    Case,
    Expectation,
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


def _response(case: Case) -> dict[str, Any]:
    body: dict[str, Any] = case.raw["response"]
    return body


def _oa01_parallel_calls(case: Case, result: Normalized) -> None:
    (sample,) = result.samples
    answer = sample.completion()
    assert answer is not None
    assert answer.content == []
    recorded = _response(case)["choices"][0]["message"]["tool_calls"]
    assert [(c.id, c.name, c.arguments) for c in answer.tool_calls] == [
        (c["id"], c["function"]["name"], c["function"]["arguments"]) for c in recorded
    ]
    assert answer.tool_calls[0].arguments == '{"location": "Seattle, WA"}'
    assert sample.response is not None
    assert sample.response.finish_reason == "tool_calls"
    assert [t.name for t in sample.tools] == ["get_current_weather"]
    assert sample.tools[0].parameters == case.raw["request"]["tools"][0]["function"]["parameters"]
    assert sample.params.tool_choice == "auto"
    usage = sample.response.usage
    assert usage is not None
    assert (usage.input_tokens, usage.output_tokens, usage.total_tokens) == (75, 51, 126)
    assert (usage.cached_input_tokens, usage.reasoning_tokens) == (0, 0)


def _oa01_replayed_history(case: Case, result: Normalized) -> None:
    (sample,) = result.samples
    roles = [m.role for m in sample.messages]
    assert roles == ["system", "user", "assistant", "tool", "tool", "assistant"]
    calls_turn = sample.messages[2]
    # The replayed assistant turn has no `content` key at all, only tool_calls.
    assert calls_turn.content == []
    assert len(calls_turn.tool_calls) == 2
    results = sample.messages[3:5]
    assert [m.tool_call_id for m in results] == [c.id for c in calls_turn.tool_calls]
    assert [m.text() for m in results] == ["50 degrees and raining", "70 degrees and sunny"]
    answer = sample.completion()
    assert answer is not None
    assert answer.text() == _response(case)["choices"][0]["message"]["content"]
    assert sample.response is not None
    assert sample.response.finish_reason == "stop"


def _oa02_two_choices(case: Case, result: Normalized) -> None:
    first, second = result.samples
    assert first.response is not None
    assert second.response is not None
    assert (first.response.choice_index, second.response.choice_index) == (0, 1)
    assert first.source_ref == second.source_ref
    assert first.id != second.id
    assert first.prompt_fingerprint() == second.prompt_fingerprint()
    assert first.params.n == 2
    assert first.params.stream is False
    assert first.response.usage == second.response.usage


def _oa03_stream(case: Case, result: Normalized) -> None:
    (sample,) = result.samples
    answer = sample.completion()
    assert answer is not None
    assert answer.content == []
    assert [(c.id, c.arguments) for c in answer.tool_calls] == [
        ("call_fHCjJqt9Pysde6vcJcvbXGBx", '{"location": "Seattle, WA"}'),
        ("call_3J9foSw3CUb48lrqIXoTky6U", '{"location": "San Francisco, CA"}'),
    ]
    assert {c.name for c in answer.tool_calls} == {"get_current_weather"}
    meta = sample.response
    assert meta is not None
    assert meta.finish_reason == "tool_calls"
    assert meta.response_id == "chatcmpl-ASYMbACebDoWcuraMEWQhU48q4dAp"
    assert meta.usage is not None
    assert meta.usage.total_tokens == 126
    assert sample.params.stream is True
    assert sample.params.model_extra == {"stream_options": {"include_usage": True}}


def _error(code: str, status: int) -> Expectation:
    def check(case: Case, result: Normalized) -> None:
        (sample,) = result.samples
        meta = sample.response
        assert meta is not None
        assert meta.status == "error"
        assert meta.finish_reason == "error"
        assert meta.error is not None
        assert (meta.error.code, meta.error.status_code) == (code, status)
        assert meta.error.type == "invalid_request_error"
        assert meta.error.message == _response(case)["error"]["message"]
        # The prompt only: there is no assistant turn.
        assert sample.completion() is None
        assert len(sample.messages) == len(case.raw["request"]["messages"])

    return check


def _oa05_data_uri(case: Case, result: Normalized) -> None:
    (sample,) = result.samples
    text, image = sample.messages[0].content
    assert isinstance(text, TextPart)
    assert isinstance(image, ImagePart)
    uri = case.raw["request"]["messages"][0]["content"][1]["image_url"]["url"]
    assert image.mime_type == "image/png"
    assert image.url is None
    assert image.data == uri.removeprefix("data:image/png;base64,")
    assert image.content_sha256() == hashlib.sha256(base64.b64decode(image.data or "")).hexdigest()
    assert result.dropped == []


def _oa06_remote_image_cut_short(case: Case, result: Normalized) -> None:
    (sample,) = result.samples
    image = sample.messages[0].content[1]
    assert isinstance(image, ImagePart)
    assert image.url == "https://source.unsplash.com/8xznAGy4HcY/800x400"
    assert image.data is None
    meta = sample.response
    assert meta is not None
    assert meta.finish_reason == "length"
    assert meta.usage is not None
    assert meta.usage.cached_input_tokens is None
    assert meta.model == "gpt-4-1106-vision-preview"
    assert meta.model_requested == "gpt-4-vision-preview"


EXPECTED: dict[str, Expectation] = {
    "oa01#0": _oa01_parallel_calls,
    "oa01#1": _oa01_replayed_history,
    "oa02#0": _oa02_two_choices,
    "oa03#0": _oa03_stream,
    "oa04#0": _error("model_not_found", 404),
    "oa05#0": _oa05_data_uri,
    "oa06#0": _oa06_remote_image_cut_short,
    "oa06#1": _oa06_remote_image_cut_short,
    "oa06#2": _error("invalid_image_url", 400),
}


@pytest.mark.parametrize("case", cases("openai"))
def test_recorded_exchange_becomes_the_right_samples(case: Case) -> None:
    assert case.key in EXPECTED, f"no expected outcome written down for {case.key}"
    check_case(case, EXPECTED[case.key])


@pytest.mark.parametrize("short", hand_built("oa"))
def test_agrees_with_the_samples_the_schema_tests_build_by_hand(short: str) -> None:
    check_against_hand_built(short)


# --- shapes the recordings do not show -----------------------------------------------------------

REQUEST: dict[str, Any] = {
    "model": "gpt-4o-mini",
    "messages": [{"role": "user", "content": "Hi"}],
}
ANSWER: dict[str, Any] = {
    "id": "chatcmpl-1",
    "model": "gpt-4o-mini",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "Hello"}, "finish_reason": "stop"}
    ],
}


def _run(request: Any = None, response: Any = None, **fields: Any) -> Normalized:
    exchange = Exchange(
        provider="openai",
        request=REQUEST if request is None else request,
        response=ANSWER if response is None and "stream" not in fields else response,
        **fields,
    )
    return normalize(exchange)


def _rejected(**fields: Any) -> NormalizeError:
    with pytest.raises(NormalizeError) as info:
        _run(**fields)
    return info.value


def test_developer_messages_are_system_and_params_are_mapped() -> None:
    request = {
        **REQUEST,
        "messages": [{"role": "developer", "content": "Be brief."}, *REQUEST["messages"]],
        "max_completion_tokens": 50,
        "stop": "END",
        "logit_bias": {"50256": -100},
    }
    (sample,) = _run(request).samples
    assert sample.messages[0].role == "system"
    assert sample.messages[0].text() == "Be brief."
    assert sample.params.max_tokens == 50
    assert sample.params.stop == ["END"]
    assert sample.params.model_extra == {"logit_bias": {"50256": -100}}


def test_refusal_is_kept_apart_from_the_content() -> None:
    answer = {"role": "assistant", "content": None, "refusal": "I can't help with that."}
    response = {**ANSWER, "choices": [{"index": 0, "message": answer, "finish_reason": "stop"}]}
    (sample,) = _run(response=response).samples
    completion = sample.completion()
    assert completion is not None
    assert completion.refusal == "I can't help with that."
    assert completion.content == []


def test_a_streamed_error_chunk_becomes_an_error_sample() -> None:
    stream = (
        'data: {"id":"c1","choices":[{"index":0,"delta":{"content":"Hel"}}]}\n\n'
        'data: {"error":{"message":"overloaded","type":"server_error","code":null}}\n\n'
    )
    (sample,) = _run(stream=stream).samples
    assert sample.response is not None
    assert sample.response.status == "error"
    assert sample.response.error is not None
    assert sample.response.error.message == "overloaded"
    assert sample.completion() is None


def test_stream_text_and_reasoning_deltas_join_per_choice() -> None:
    chunks = [
        {"choices": [{"index": 1, "delta": {"content": "B"}}]},
        {"choices": [{"index": 0, "delta": {"reasoning_content": "think"}}]},
        {"choices": [{"index": 0, "delta": {"content": "A1"}}]},
        {"choices": [{"index": 0, "delta": {"content": "A2"}, "finish_reason": "stop"}]},
    ]
    stream = "".join(f"data: {json.dumps(c)}\r\n\r\n" for c in chunks) + "data: [DONE]\r\n\r\n"
    first, second = _run(stream=stream).samples
    assert [m.text() for m in (first.messages[-1], second.messages[-1])] == ["A1A2", "B"]
    assert [b.text for b in first.messages[-1].reasoning] == ["think"]
    assert first.response is not None
    assert first.response.finish_reason == "stop"
    assert second.response is not None
    assert second.response.choice_index == 1


def test_a_stream_line_that_is_not_json_is_named() -> None:
    stream = 'data: {"choices":[]}\n\ndata: {not json\n\n'
    error = _rejected(stream=stream)
    assert error.path == "stream line 3"
    assert "not valid JSON" in error.reason


@pytest.mark.parametrize(
    ("messages", "path", "says"),
    [
        ([{"role": "robot", "content": "x"}], "messages[0].role", "unknown role 'robot'"),
        ([{"role": "user", "content": [{"text": "x"}]}], "messages[0].content[0].type", "string"),
        ([{"role": "tool", "content": "42"}], "messages[0].tool_call_id", "required"),
        (
            [
                {
                    "role": "assistant",
                    "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{bad"}}],
                }
            ],
            "messages[0].tool_calls[0].function.arguments",
            "JSON",
        ),
        (
            [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:x"}}]}],
            "messages[0].content[0].image_url.url",
            "data URI",
        ),
        ([], "messages", "must not be empty"),
    ],
)
def test_bad_requests_are_rejected_naming_the_field(messages: Any, path: str, says: str) -> None:
    error = _rejected(request={**REQUEST, "messages": messages})
    assert error.path == path
    assert says in error.reason


def test_unsupported_parts_are_dropped_with_a_note() -> None:
    content = [{"type": "text", "text": "x"}, {"type": "video_url", "video_url": {"url": "v"}}]
    request = {**REQUEST, "messages": [{"role": "user", "content": content}]}
    result = _run(request)
    assert [p.type for p in result.samples[0].messages[0].content] == ["text"]
    assert [(d.path, d.reason) for d in result.dropped] == [
        ("messages[0].content[1].type", "unsupported content part type 'video_url'")
    ]


def test_a_response_without_choices_is_rejected() -> None:
    error = _rejected(response={"id": "x", "choices": []})
    assert error.path == "response.choices"


def test_created_at_defaults_to_now_in_utc() -> None:
    before = datetime.now(UTC)
    (sample,) = _run().samples
    assert before <= sample.created_at <= datetime.now(UTC)
    assert sample.created_at.tzinfo == UTC


def test_a_key_echoed_in_an_error_message_is_redacted() -> None:
    key = "sk-proj-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789abcd"
    body = {
        "error": {
            "message": f"Incorrect API key provided: {key}.",
            "type": "invalid_request_error",
            "code": "invalid_api_key",
        }
    }
    (sample,) = _run(response=body, status=401).samples
    assert sample.response is not None
    assert sample.response.error is not None
    assert sample.response.error.code == "invalid_api_key"
    assert key not in sample.to_json_bytes().decode()


def test_an_exchange_without_a_response_is_rejected() -> None:
    with pytest.raises(NormalizeError) as info:
        normalize(Exchange(provider="openai", request=REQUEST))
    assert info.value.path == "response"


# --- fuzzing -------------------------------------------------------------------------------------

_FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_FUZZ
@given(
    field=st.sampled_from(
        ["messages", "tools", "model", "temperature", "stop", "tool_choice", "n"]
    ),
    value=json_values,
)
def test_any_json_at_a_request_field_is_a_sample_or_a_normalize_error(
    field: str, value: Any
) -> None:
    normalize_or_reject(
        Exchange(provider="openai", request={**REQUEST, field: value}, response=ANSWER)
    )


@_FUZZ
@given(messages=st.lists(json_values, max_size=3))
def test_any_json_messages_are_a_sample_or_a_normalize_error(messages: list[Any]) -> None:
    normalize_or_reject(
        Exchange(provider="openai", request={**REQUEST, "messages": messages}, response=ANSWER)
    )


@_FUZZ
@given(
    field=st.sampled_from(["choices", "usage", "model", "id", "error"]),
    value=json_values,
    status=st.sampled_from([200, 400, 500]),
)
def test_any_json_in_the_response_is_a_sample_or_a_normalize_error(
    field: str, value: Any, status: int
) -> None:
    response = {**ANSWER, field: value}
    normalize_or_reject(
        Exchange(provider="openai", request=REQUEST, status=status, response=response)
    )


@_FUZZ
@given(chunks=st.lists(json_values, max_size=4), raw=st.text(max_size=40))
def test_any_stream_is_a_sample_or_a_normalize_error(chunks: list[Any], raw: str) -> None:
    stream = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + raw
    normalize_or_reject(Exchange(provider="openai", request=REQUEST, stream=stream))


@_FUZZ
@given(data=st.data())
def test_a_recorded_exchange_changed_anywhere_is_a_sample_or_a_normalize_error(
    data: st.DataObject,
) -> None:
    case = data.draw(st.sampled_from(recorded("openai")))
    normalize_or_reject(mutated(case, data))

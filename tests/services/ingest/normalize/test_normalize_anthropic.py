"""Anthropic Messages -> canonical samples: every recorded exchange becomes the right sample,
streamed tool input is joined before it is parsed, and no input makes the normaliser fail with
anything but a NormalizeError."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.ingest.normalize import Exchange, Normalized, NormalizeError
from services.ingest.normalize.anthropic import normalize
from shared.chat import FilePart, ImagePart, TextPart
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


def _only(result: Normalized) -> Any:
    (sample,) = result.samples
    return sample


def _image_block(case: Case, turn: int) -> dict[str, Any]:
    blocks = case.raw["request"]["messages"][turn]["content"]
    block: dict[str, Any] = next(b for b in blocks if b["type"] == "image")
    return block


def _an01_text_turn(case: Case, result: Normalized) -> None:
    sample = _only(result)
    assert [m.role for m in sample.messages] == ["system", "user", "assistant"]
    assert sample.messages[0].text() == case.raw["request"]["system"]
    assert sample.params.max_tokens == 1024
    assert sample.response.finish_reason == "stop"
    assert sample.response.finish_reason_raw == "end_turn"


def _an01_large_jpeg(case: Case, result: Normalized) -> None:
    sample = _only(result)
    image = sample.messages[3].content[1]
    assert isinstance(image, ImagePart)
    source = _image_block(case, 2)["source"]
    assert image.mime_type == "image/jpeg"
    assert image.data == source["data"]
    assert base64.b64decode(image.data or "")[:3] == b"\xff\xd8\xff"
    assert result.dropped == []
    # The replayed assistant turn (an array of text blocks) is history, not the answer.
    assert sample.messages[2].role == "assistant"
    assert sample.completion() is not sample.messages[2]


def _an02_mislabelled_jpeg(case: Case, result: Normalized) -> None:
    sample = _only(result)
    image = sample.messages[0].content[1]
    assert isinstance(image, ImagePart)
    # Declared image/png, but the bytes are JPEG: what the bytes are wins, and it is noted.
    assert image.mime_type == "image/jpeg"
    assert image.data == _image_block(case, 0)["source"]["data"]
    (note,) = result.dropped
    assert note.path == "messages[0].content[1].source.media_type"
    assert "image/png" in note.reason
    assert "image/jpeg" in note.reason


def _tool_calls(case: Case, result: Normalized, names: list[str]) -> None:
    sample = _only(result)
    answer = sample.completion()
    assert [c.name for c in answer.tool_calls] == names
    recorded = [b for b in case.raw["response"]["content"] if b["type"] == "tool_use"]
    assert [c.parse_arguments() for c in answer.tool_calls] == [b["input"] for b in recorded]
    assert [c.id for c in answer.tool_calls] == [b["id"] for b in recorded]
    assert sample.response.finish_reason == "tool_calls"
    tools = {t.name: t.parameters for t in sample.tools}
    assert tools == {t["name"]: t["input_schema"] for t in case.raw["request"]["tools"]}


def _an03_parallel_tool_use(case: Case, result: Normalized) -> None:
    _tool_calls(case, result, ["get_weather", "get_time"])
    answer = _only(result).completion()
    assert answer.text().startswith("Certainly!")
    assert answer.tool_calls[0].arguments == '{"location": "New York, NY", "unit": "fahrenheit"}'


def _an04_tool_result_history(case: Case, result: Normalized) -> None:
    _tool_calls(case, result, ["get_time"])
    sample = _only(result)
    calls_turn, tool_result = sample.messages[1], sample.messages[2]
    assert [c.id for c in calls_turn.tool_calls] == ["call_1"]
    assert tool_result.role == "tool"
    assert tool_result.tool_call_id == "call_1"
    assert tool_result.text() == "Sunny and 65 degrees Fahrenheit"


def _an05_unicode_and_is_error(case: Case, result: Normalized) -> None:
    sample = _only(result)
    tool_result = sample.messages[2]
    assert tool_result.role == "tool"
    assert tool_result.is_error is False
    assert tool_result.text() == '{"weather": "sunny", "temperature": "75"}'
    text = sample.completion().text()
    assert "75°F" in text
    assert "\u2600\ufe0f" in text
    assert text == case.raw["response"]["content"][0]["text"]


def _an06_thinking(case: Case, result: Normalized) -> None:
    sample = _only(result)
    answer = sample.completion()
    thinking = case.raw["response"]["content"][0]
    (block,) = answer.reasoning
    assert (block.text, block.signature) == (thinking["thinking"], thinking["signature"])
    assert answer.text() == "The letter 'r' appears 3 times in the word \"strawberry\"."
    assert thinking["thinking"] not in answer.text()
    assert sample.params.model_extra == {"thinking": {"type": "enabled", "budget_tokens": 1024}}


def _an07_cached_system_blocks(written: int, read: int) -> Expectation:
    def check(case: Case, result: Normalized) -> None:
        sample = _only(result)
        system = sample.messages[0]
        assert system.role == "system"
        assert [p.text for p in system.content] == [
            b["text"] for b in case.raw["request"]["system"]
        ]
        assert len(sample.messages[1].text()) > 5000
        # cache_control is a caching hint: dropping it loses nothing, so it is not noted.
        assert result.dropped == []
        usage = sample.response.usage
        assert usage.input_tokens == 4 + written + read
        assert usage.cached_input_tokens == read
        assert usage.total_tokens == usage.input_tokens + usage.output_tokens

    return check


def _an08_stream(case: Case, result: Normalized) -> None:
    sample = _only(result)
    answer = sample.completion()
    assert answer.text() == (
        "Certainly! I can help you with that information. To get the weather and current time "
        "in San Francisco, I'll need to use two separate functions. Let me fetch that data for you."
    )
    assert [(c.id, c.name, c.parse_arguments()) for c in answer.tool_calls] == [
        (
            "toolu_014x5X91kx3fvdhpLvwXZWE2",
            "get_weather",
            {"location": "San Francisco, CA", "unit": "celsius"},
        ),
        ("toolu_0121kXsENLvoDZ72LCuAnCCz", "get_time", {"timezone": "America/Los_Angeles"}),
    ]
    meta = sample.response
    assert meta.finish_reason == "tool_calls"
    assert meta.response_id == "msg_0138UNF3YbNp49KkqZtUBWqz"
    # Input from message_start, output from message_delta (it replaces the start's 5).
    assert (meta.usage.input_tokens, meta.usage.output_tokens) == (506, 153)
    assert sample.params.stream is True
    assert result.dropped == []


EXPECTED: dict[str, Expectation] = {
    "an01#0": _an01_text_turn,
    "an01#1": _an01_large_jpeg,
    "an02#0": _an02_mislabelled_jpeg,
    "an03#0": _an03_parallel_tool_use,
    "an04#0": _an04_tool_result_history,
    "an05#0": _an05_unicode_and_is_error,
    "an06#0": _an06_thinking,
    "an07#0": _an07_cached_system_blocks(written=1163, read=0),
    "an07#1": _an07_cached_system_blocks(written=0, read=1163),
    "an08#0": _an08_stream,
}


@pytest.mark.parametrize("case", cases("anthropic"))
def test_recorded_exchange_becomes_the_right_sample(case: Case) -> None:
    assert case.key in EXPECTED, f"no expected outcome written down for {case.key}"
    check_case(case, EXPECTED[case.key])


@pytest.mark.parametrize("short", hand_built("an"))
def test_agrees_with_the_samples_the_schema_tests_build_by_hand(short: str) -> None:
    check_against_hand_built(short)


# --- shapes the recordings do not show -----------------------------------------------------------

REQUEST: dict[str, Any] = {
    "model": "claude-sonnet-4-5",
    "max_tokens": 100,
    "messages": [{"role": "user", "content": "Hi"}],
}
ANSWER: dict[str, Any] = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4-5",
    "content": [{"type": "text", "text": "Hello"}],
    "stop_reason": "end_turn",
    "usage": {"input_tokens": 3, "output_tokens": 1},
}


def _run(request: Any = None, response: Any = None, **fields: Any) -> Normalized:
    exchange = Exchange(
        provider="anthropic",
        request=REQUEST if request is None else request,
        response=ANSWER if response is None and "stream" not in fields else response,
        **fields,
    )
    return normalize(exchange)


def _with_messages(*messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {**REQUEST, "messages": list(messages), **extra}


def test_tool_results_with_blocks_errors_and_following_text_keep_their_order() -> None:
    png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
    user = {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "t1", "is_error": True, "content": "boom"},
            {
                "type": "tool_result",
                "tool_use_id": "t2",
                "content": [
                    {"type": "text", "text": "chart:"},
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": png},
                    },
                ],
            },
            {"type": "text", "text": "Now summarise."},
        ],
    }
    calls = {
        "role": "assistant",
        "content": [
            {"type": "tool_use", "id": "t1", "name": "a", "input": {}},
            {"type": "tool_use", "id": "t2", "name": "b", "input": {"x": 1}},
        ],
    }
    (sample,) = _run(_with_messages(REQUEST["messages"][0], calls, user)).samples
    first, second, text = sample.messages[2:5]
    assert (first.role, first.tool_call_id, first.is_error, first.text()) == (
        "tool",
        "t1",
        True,
        "boom",
    )
    assert second.tool_call_id == "t2"
    assert isinstance(second.content[1], ImagePart)
    assert text.role == "user"
    assert text.text() == "Now summarise."


def test_redacted_thinking_url_images_and_pdf_documents() -> None:
    assistant = {
        "role": "assistant",
        "content": [
            {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix"},
            {"type": "text", "text": "ok"},
        ],
    }
    pdf = base64.b64encode(b"%PDF-1.7 tiny").decode()
    user = {
        "role": "user",
        "content": [
            {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.jpg"}},
            {
                "type": "document",
                "source": {"type": "base64", "media_type": "application/pdf", "data": pdf},
            },
        ],
    }
    (sample,) = _run(_with_messages(REQUEST["messages"][0], assistant, user)).samples
    assert sample.messages[1].reasoning[0].redacted == "EmwKAhgBEgy3va3pzix"
    image, document = sample.messages[2].content
    assert isinstance(image, ImagePart)
    assert image.url == "https://example.com/cat.jpg"
    assert isinstance(document, FilePart)
    assert document.mime_type == "application/pdf"


def test_a_prefilled_assistant_turn_is_joined_with_its_continuation() -> None:
    request = _with_messages(
        REQUEST["messages"][0], {"role": "assistant", "content": '{"answer": '}
    )
    response = {**ANSWER, "content": [{"type": "text", "text": '"hello"}'}]}
    (sample,) = _run(request, response).samples
    assert [m.role for m in sample.messages] == ["user", "assistant"]
    assert sample.messages[-1].content == [TextPart(text='{"answer": "hello"}')]


def test_tool_choice_and_stop_sequences_read_as_openai_params() -> None:
    request = {
        **REQUEST,
        "tool_choice": {"type": "tool", "name": "get_time", "disable_parallel_tool_use": True},
        "stop_sequences": ["\n\nHuman:"],
        "metadata": {"user_id": "u-1"},
    }
    (sample,) = _run(request).samples
    assert sample.params.tool_choice == {"type": "function", "function": {"name": "get_time"}}
    assert sample.params.parallel_tool_calls is False
    assert sample.params.stop == ["\n\nHuman:"]
    assert sample.params.model_extra == {"metadata": {"user_id": "u-1"}}


def test_server_tools_and_unknown_blocks_are_noted() -> None:
    request = _with_messages(
        {
            "role": "user",
            "content": [{"type": "text", "text": "x"}, {"type": "search_result", "content": []}],
        },
        tools=[{"type": "web_search_20250305", "name": "web_search"}],
    )
    result = _run(request)
    assert result.samples[0].tools == []
    assert {d.path for d in result.dropped} == {"messages[0].content[1]", "tools[0]"}


def test_an_error_event_in_the_stream_becomes_an_error_sample() -> None:
    stream = (
        'event: message_start\ndata: {"type":"message_start","message":{"id":"m","model":"c","content":[],"usage":{"input_tokens":1}}}\n\n'
        'event: error\ndata: {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}\n\n'
    )
    (sample,) = _run(stream=stream).samples
    assert sample.response is not None
    assert sample.response.error is not None
    assert (sample.response.error.type, sample.response.error.message) == (
        "overloaded_error",
        "Overloaded",
    )


def test_tool_input_fragments_that_do_not_form_json_are_named() -> None:
    events: list[dict[str, Any]] = [
        {"type": "message_start", "message": {"id": "m", "content": [], "usage": {}}},
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "tool_use", "id": "t", "name": "f", "input": {}},
        },
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "input_json_delta", "partial_json": '{"a": '},
        },
        {"type": "message_stop"},
    ]
    stream = "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events)
    with pytest.raises(NormalizeError) as info:
        _run(stream=stream)
    assert info.value.path == "stream.content[0].input"


@pytest.mark.parametrize(
    ("request_body", "path"),
    [
        (_with_messages({"role": "system", "content": "x"}), "messages[0].role"),
        (
            _with_messages({"role": "user", "content": [{"type": "tool_result", "content": "x"}]}),
            "messages[0].content[0].tool_use_id",
        ),
        (
            _with_messages(
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": "!!"},
                        }
                    ],
                }
            ),
            "messages[0].content[0].source.data",
        ),
        (
            _with_messages(
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t", "name": "f", "input": [1]}],
                }
            ),
            "messages[0].content[0].input",
        ),
        ({**REQUEST, "messages": []}, "messages"),
    ],
)
def test_bad_requests_are_rejected_naming_the_field(
    request_body: dict[str, Any], path: str
) -> None:
    with pytest.raises(NormalizeError) as info:
        _run(request_body)
    assert info.value.path == path


# --- fuzzing -------------------------------------------------------------------------------------

_FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_FUZZ
@given(
    field=st.sampled_from(
        ["messages", "system", "tools", "tool_choice", "max_tokens", "stop_sequences"]
    ),
    value=json_values,
)
def test_any_json_at_a_request_field_is_a_sample_or_a_normalize_error(
    field: str, value: Any
) -> None:
    normalize_or_reject(
        Exchange(provider="anthropic", request={**REQUEST, field: value}, response=ANSWER)
    )


@_FUZZ
@given(content=st.lists(json_values, max_size=3), role=st.sampled_from(["user", "assistant"]))
def test_any_content_blocks_are_a_sample_or_a_normalize_error(
    content: list[Any], role: str
) -> None:
    request = _with_messages({"role": role, "content": content})
    normalize_or_reject(Exchange(provider="anthropic", request=request, response=ANSWER))


@_FUZZ
@given(
    field=st.sampled_from(["content", "usage", "stop_reason", "type", "error"]), value=json_values
)
def test_any_json_in_the_response_is_a_sample_or_a_normalize_error(field: str, value: Any) -> None:
    normalize_or_reject(
        Exchange(provider="anthropic", request=REQUEST, response={**ANSWER, field: value})
    )


@_FUZZ
@given(events=st.lists(json_values, max_size=5))
def test_any_stream_is_a_sample_or_a_normalize_error(events: list[Any]) -> None:
    start = {"type": "message_start", "message": {"id": "m", "content": [], "usage": {}}}
    stream = "".join(f"data: {json.dumps(e)}\n\n" for e in [start, *events])
    normalize_or_reject(Exchange(provider="anthropic", request=REQUEST, stream=stream))


@_FUZZ
@given(data=st.data())
def test_a_recorded_exchange_changed_anywhere_is_a_sample_or_a_normalize_error(
    data: st.DataObject,
) -> None:
    case = data.draw(st.sampled_from(recorded("anthropic")))
    normalize_or_reject(mutated(case, data))

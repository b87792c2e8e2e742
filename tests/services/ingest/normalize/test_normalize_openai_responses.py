"""OpenAI Responses -> canonical samples: items fold into the turns Chat Completions would have
sent, a stream is read from its final event, and bad input is refused naming the field. The
payloads follow OpenAI's API reference (the fixtures hold no Responses recordings)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from services.ingest.normalize import RESPONSES_PATH, Exchange, NormalizeError, normalize
from shared.chat import ImagePart, Sample
from tests.services.ingest.normalize.normalize_cases import json_values

WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather for a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
    "strict": True,
}
USAGE = {
    "input_tokens": 36,
    "input_tokens_details": {"cached_tokens": 4},
    "output_tokens": 87,
    "output_tokens_details": {"reasoning_tokens": 64},
    "total_tokens": 123,
}


def _response(output: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "id": "resp_67ccd2bed1ec8190b14f964abc0542670bb6a6b452d3795b",
        "object": "response",
        "created_at": 1741476542,
        "status": "completed",
        "model": "gpt-4.1-2025-04-14",
        "output": output,
        "usage": USAGE,
        **extra,
    }


def _answer_text(text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": "msg_1",
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def _exchange(request: dict[str, Any], **fields: Any) -> Exchange:
    return Exchange(provider="openai", request=request, api_path=RESPONSES_PATH, **fields)


def test_instructions_and_a_string_input_make_system_and_user_turns() -> None:
    request = {
        "model": "gpt-4.1",
        "instructions": "Talk like a pirate.",
        "input": "Are semicolons optional in JavaScript?",
        "temperature": 0.3,
        "max_output_tokens": 400,
        "reasoning": {"effort": "low"},
        "store": False,
    }
    result = normalize(_exchange(request, response=_response([_answer_text("Arr, mostly.")])))
    (sample,) = result.samples
    assert [(m.role, m.text()) for m in sample.messages] == [
        ("system", "Talk like a pirate."),
        ("user", "Are semicolons optional in JavaScript?"),
        ("assistant", "Arr, mostly."),
    ]
    assert (sample.params.temperature, sample.params.max_tokens) == (0.3, 400)
    assert sample.params.reasoning_effort == "low"
    assert sample.params.model_extra == {"store": False}
    meta = sample.response
    assert meta is not None
    assert (meta.provider, meta.model_requested, meta.model) == (
        "openai",
        "gpt-4.1",
        "gpt-4.1-2025-04-14",
    )
    assert (meta.finish_reason, meta.finish_reason_raw) == ("stop", "completed")
    assert meta.usage is not None
    assert (meta.usage.input_tokens, meta.usage.output_tokens, meta.usage.total_tokens) == (
        36,
        87,
        123,
    )
    assert (meta.usage.cached_input_tokens, meta.usage.reasoning_tokens) == (4, 64)
    assert result.dropped == []


def test_function_calls_and_their_outputs_fold_into_turns() -> None:
    """Reasoning, text and function-call items of one assistant turn are one message; a call's
    output is a tool message paired by call id."""
    request = {
        "model": "o4-mini",
        "tools": [WEATHER_TOOL, {"type": "web_search_preview"}],
        "input": [
            {"role": "user", "content": [
                {"type": "input_text", "text": "Weather in Paris and Oslo?"},
                {"type": "input_image", "image_url": "https://example.com/map.png",
                 "detail": "low"},
            ]},
            {"type": "reasoning", "id": "rs_1",
             "summary": [{"type": "summary_text", "text": "Two cities: two calls."}]},
            {"type": "function_call", "id": "fc_1", "call_id": "call_paris",
             "name": "get_weather", "arguments": '{"city": "Paris"}'},
            {"type": "function_call", "id": "fc_2", "call_id": "call_oslo",
             "name": "get_weather", "arguments": '{"city": "Oslo"}'},
            {"type": "function_call_output", "call_id": "call_paris", "output": '{"temp_c": 18}'},
            {"type": "function_call_output", "call_id": "call_oslo", "output": '{"temp_c": 4}'},
        ],
    }  # fmt: skip
    output = [
        {"type": "reasoning", "id": "rs_2", "summary": [], "encrypted_content": "gAAAAB..."},
        _answer_text("Paris is 18 °C, Oslo 4 °C."),
    ]
    (sample,) = normalize(_exchange(request, response=_response(output))).samples
    roles = [m.role for m in sample.messages]
    assert roles == ["user", "assistant", "tool", "tool", "assistant"]
    user, calls, paris, oslo, answer = sample.messages
    assert isinstance(user.content[1], ImagePart)
    assert user.content[1].url == "https://example.com/map.png"
    assert calls.reasoning[0].text == "Two cities: two calls."
    assert [(c.id, c.name, json.loads(c.arguments)) for c in calls.tool_calls] == [
        ("call_paris", "get_weather", {"city": "Paris"}),
        ("call_oslo", "get_weather", {"city": "Oslo"}),
    ]
    assert (paris.tool_call_id, paris.text(), oslo.tool_call_id) == (
        "call_paris",
        '{"temp_c": 18}',
        "call_oslo",
    )
    assert answer.text() == "Paris is 18 °C, Oslo 4 °C."
    assert answer.reasoning[0].redacted == "gAAAAB..."
    assert [t.name for t in sample.tools] == ["get_weather"]
    assert sample.tools[0].parameters == WEATHER_TOOL["parameters"]


def test_an_answer_of_function_calls_finishes_with_tool_calls() -> None:
    output = [
        {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather",
         "arguments": '{"city": "Lyon"}', "status": "completed"},
    ]  # fmt: skip
    request = {"model": "gpt-4.1", "input": "Weather in Lyon?", "tools": [WEATHER_TOOL]}
    (sample,) = normalize(_exchange(request, response=_response(output))).samples
    answer = sample.completion()
    assert answer is not None
    assert [c.name for c in answer.tool_calls] == ["get_weather"]
    assert sample.response is not None
    assert sample.response.finish_reason == "tool_calls"


def test_a_stream_is_read_from_its_completed_event() -> None:
    final = _response([_answer_text("In a peaceful grove...")])
    events = [
        {"type": "response.created", "sequence_number": 0,
         "response": final | {"status": "in_progress", "output": []}},
        {"type": "response.output_text.delta", "sequence_number": 1, "item_id": "msg_1",
         "output_index": 0, "content_index": 0, "delta": "In a peaceful grove..."},
        {"type": "response.completed", "sequence_number": 2, "response": final},
    ]  # fmt: skip
    stream = "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events)
    request = {"model": "gpt-4.1", "input": "A story", "stream": True}
    streamed = normalize(_exchange(request, stream=stream)).samples
    whole = normalize(_exchange(request, response=final)).samples
    assert [s.messages for s in streamed] == [s.messages for s in whole]
    assert streamed[0].response == whole[0].response


def test_a_stream_cut_before_its_final_event_is_refused() -> None:
    start = {"type": "response.created", "response": _response([])}
    stream = f"event: response.created\ndata: {json.dumps(start)}\n\n"
    with pytest.raises(NormalizeError, match=r"no response\.completed event"):
        normalize(_exchange({"model": "gpt-4.1", "input": "x", "stream": True}, stream=stream))


def test_an_incomplete_answer_finishes_with_length() -> None:
    response = _response(
        [_answer_text("Once upon a")],
        status="incomplete",
        incomplete_details={"reason": "max_output_tokens"},
    )
    (sample,) = normalize(_exchange({"model": "gpt-4.1", "input": "x"}, response=response)).samples
    assert sample.response is not None
    assert (sample.response.finish_reason, sample.response.finish_reason_raw) == (
        "length",
        "max_output_tokens",
    )


def test_failed_calls_are_samples_of_the_prompt_and_the_error() -> None:
    error = {
        "error": {
            "message": "Invalid value: 'robot'.",
            "type": "invalid_request_error",
            "param": "input[0].role",
            "code": "invalid_value",
        }
    }
    (refused,) = normalize(
        _exchange({"model": "gpt-4.1", "input": "hi"}, status=400, response=error)
    ).samples
    assert refused.response is not None
    assert refused.response.status == "error"
    assert refused.response.error is not None
    assert refused.response.error.code == "invalid_value"
    assert [m.role for m in refused.messages] == ["user"]
    stream = 'event: error\ndata: {"type": "error", "code": "server_error", "message": "boom"}\n\n'
    (cut,) = normalize(_exchange({"model": "gpt-4.1", "input": "hi"}, stream=stream)).samples
    assert cut.response is not None
    assert cut.response.status == "error"
    assert cut.response.error is not None
    assert cut.response.error.message == "boom"


def test_what_is_not_carried_is_reported() -> None:
    request = {
        "model": "gpt-4.1",
        "previous_response_id": "resp_123",
        "tools": [{"type": "file_search", "vector_store_ids": ["vs_1"]}],
        "input": [{"type": "item_reference", "id": "msg_0"}, {"role": "user", "content": "More"}],
    }
    output = [{"type": "web_search_call", "id": "ws_1", "status": "completed"},
              _answer_text("Here is more.")]  # fmt: skip
    result = normalize(_exchange(request, response=_response(output)))
    (sample,) = result.samples
    assert [m.role for m in sample.messages] == ["user", "assistant"]
    assert sample.params.model_extra == {"previous_response_id": "resp_123"}
    dropped = {d.path: d.reason for d in result.dropped}
    assert "previous_response_id" in dropped["previous_response_id"]
    assert dropped["tools[0]"] == "'file_search' tools are not carried (only function tools)"
    assert dropped["input[0].type"] == "'item_reference' items are not carried"
    assert dropped["response.output[0].type"] == "'web_search_call' items are not carried"


@pytest.mark.parametrize(
    ("request_body", "path"),
    [
        ({"model": "gpt-4.1", "input": [{"role": "robot", "content": "hi"}]}, "input[0].role"),
        ({"model": "gpt-4.1", "input": [{"type": "function_call", "name": "f"}]},
         "input[0].call_id"),
        ({"model": "gpt-4.1", "input": [{"role": "user", "content": [{"type": "input_image"}]}]},
         "input[0].content[0].image_url"),
        ({"model": "gpt-4.1", "input": []}, "input"),
        ({"model": "gpt-4.1", "input": 7}, "input"),
    ],
)  # fmt: skip
def test_bad_requests_are_refused_naming_the_field(request_body: dict[str, Any], path: str) -> None:
    with pytest.raises(NormalizeError) as caught:
        normalize(_exchange(request_body, response=_response([_answer_text("x")])))
    assert caught.value.path == path


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(request=json_values, response=json_values)
def test_any_input_gives_samples_or_a_normalize_error(request: Any, response: Any) -> None:
    exchange = _exchange(
        request if isinstance(request, dict) else {"input": request},
        response=response if isinstance(response, dict) else {"output": response},
    )
    try:
        result = normalize(exchange)
    except NormalizeError:
        return
    for sample in result.samples:
        assert sample.messages
        assert Sample.from_json_bytes(sample.to_json_bytes()) == sample

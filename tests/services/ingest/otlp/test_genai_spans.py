"""GenAI spans -> canonical samples (services/ingest/otlp/genai_spans.py and the modules behind it):
every OTLP fixture file, the semconv examples and schema cases, trace assembly, and hostile
content."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from services.ingest.otlp.export import Limits, decode_export, encode_response
from services.ingest.otlp.genai_spans import TraceResult, spans_to_samples, summarize_rejections
from shared.chat import AudioPart, FilePart, ImagePart, Message, Sample, TextPart, ToolCall, Usage
from tests.services.ingest.otlp.test_otlp import (
    JSON,
    OTLP,
    PROTO,
    export_json,
    fixture_body,
    fixtures_dir,
    needs_fixtures,
    span_json,
    spans_to_proto,
)

SEMCONV = fixtures_dir() / "semconv"
TRACE = "0af7651916cd43dd8448eb211c80319c"
T0 = 1_700_000_000_000_000_000  # span times in tests are offsets (ns) from here


def run(body: bytes, content_type: str = JSON, **kwargs: Any) -> TraceResult:
    return spans_to_samples(decode_export(body, content_type, **kwargs), tenant="acme")


def only(result: TraceResult) -> Sample:
    assert result.rejected == []
    assert len(result.samples) == 1
    return result.samples[0]


def turns(sample: Sample) -> list[tuple[str, str]]:
    return [(m.role, m.text()) for m in sample.messages]


def ns_time(ns: int) -> datetime:
    return datetime.fromtimestamp(ns // 1000 / 1e6, UTC)


# --- every fixture file ----------------------------------------------------------------------------


def check_no_genai(result: TraceResult) -> None:
    assert (result.samples, result.rejected, result.dropped) == ([], [], [])


def check_ot06(result: TraceResult) -> None:
    sample = only(result)
    assert sample.source_ref.startswith("9ed94f9bdc36b397e11c51f77d49e01a/")
    assert sample.created_at == ns_time(1788787518970589000)
    assert turns(sample) == [
        ("system", "You are a support agent. Use the tools you are given."),
        ("user", "Where is order A-1187?"),
        ("assistant", ""),
    ]
    assert sample.messages[-1].tool_calls == [
        ToolCall(id="call_9RtYbK2mXqLp", name="lookup_order", arguments='{"order_id": "A-1187"}')
    ]
    assert sample.tools[0].name == "lookup_order"
    assert sample.tools[0].parameters == {
        "type": "object",
        "properties": {"order_id": {"type": "string"}},
        "required": ["order_id"],
    }
    assert sample.params.model_dump(exclude_none=True) == {
        "temperature": 0.7,
        "top_p": 0.95,
        "max_tokens": 1024,
    }
    response = sample.response
    assert response is not None
    assert (response.provider, response.model_requested, response.model) == (
        "openai",
        "gpt-4o-mini",
        "gpt-4o-mini-2024-07-18",
    )
    assert (response.finish_reason, response.finish_reason_raw) == ("tool_calls", "tool_calls")
    assert response.usage == Usage(
        input_tokens=412,
        output_tokens=27,
        total_tokens=439,
        cached_input_tokens=256,
        reasoning_tokens=8,
    )
    assert response.latency_ms == pytest.approx(23.086)


def check_ot07(result: TraceResult) -> None:
    sample = only(result)  # the double-encoded workflow span carries no GenAI content
    assert result.dropped == []
    assert sample.source_ref.startswith("77d66be22a4ffc8149309684b3a319f7/")
    assert [m.role for m in sample.messages] == ["system", "user", "assistant"]
    (call,) = sample.messages[-1].tool_calls
    assert (call.id, call.name, call.parse_arguments()) == (
        "call_9RtYbK2mXqLp",
        "lookup_order",
        {"order_id": "A-1187"},
    )
    assert [t.name for t in sample.tools] == ["lookup_order"]
    response = sample.response
    assert response is not None
    assert (response.finish_reason_raw, response.finish_reason) == ("tool_call", "tool_calls")
    assert response.response_id == "chatcmpl-CD8yqQ2y3kZs1o0Wm7bT"
    assert response.usage is not None
    assert (response.usage.cached_input_tokens, response.usage.reasoning_tokens) == (256, 8)
    assert sample.metadata["service.name"] == "capture"
    assert sample.params.max_tokens == 1024


def check_lf01(result: TraceResult) -> None:
    sample = only(result)
    assert turns(sample)[0] == ("user", "What is LLM Observability?")
    assert sample.messages[1].text().startswith("LLM Observability stands for logs")
    assert sample.params.max_tokens is None  # -1 means unset
    assert sample.params.seed is None  # ""
    assert sample.params.temperature == 1.0
    assert sample.response is not None
    assert sample.response.usage == Usage(input_tokens=14, output_tokens=96, total_tokens=110)
    assert (sample.response.provider, sample.response.finish_reason) == ("openai", "stop")


def check_lf02(result: TraceResult) -> None:
    sample = only(result)
    assert [m.role for m in sample.messages] == ["user", "assistant"]
    assert sample.messages[0].text() == "What is LLM Observability?"
    response = sample.response
    assert response is not None
    assert response.usage == Usage(input_tokens=14, output_tokens=173, total_tokens=187)
    assert (response.provider, response.model, response.finish_reason) == (
        "openai",
        "gpt-3.5-turbo-0125",
        "stop",
    )
    assert sample.metadata["otlp.provider"] == "OpenAI"
    assert not any("headers" in key for key in sample.metadata)


def check_lf03(result: TraceResult) -> None:
    sample = only(result)
    assert turns(sample) == [
        ("system", "You are a helpful assistant."),
        ("user", "What is the capital of France?"),
        ("assistant", "The capital of France is Paris."),
    ]
    assert sample.response is not None
    assert (sample.response.model, sample.response.finish_reason) == ("gpt-4-0613", "stop")


def check_lf04(result: TraceResult) -> None:
    sample = only(result)
    assert turns(sample) == [
        ("system", "You are a helpful assistant."),  # a bare string, not a part array
        ("user", "What is the capital of France?"),
        ("assistant", "Paris"),
    ]
    assert sample.response is not None
    assert (sample.response.model_requested, sample.response.finish_reason) == (
        "gpt-4o-mini",
        "stop",
    )


def check_lf05(result: TraceResult) -> None:
    sample = only(result)
    assert turns(sample) == [
        ("system", "You are a helpful assistant."),
        ("user", "What is the weather today?"),
        ("assistant", "I don't have access to real-time weather data."),
    ]
    assert sample.metadata["attr.custom_attribute"] == "should_be_preserved"


def check_lf06(result: TraceResult) -> None:
    sample = only(result)
    assert turns(sample) == [
        ("system", "Answer concisely."),
        ("user", "hello"),
        ("assistant", "hi"),
    ]
    assert sample.metadata["attr.custom.generation.attribute"] == "keep-generation"
    # The tool span answers no tool call: noted, never invented into an assistant turn.
    (note,) = result.dropped
    assert note.path == "span[1234567890abcdee]"
    assert "get_weather" in note.reason


def check_lf07(result: TraceResult) -> None:
    sample = only(result)
    assert [m.role for m in sample.messages] == ["system", "user", "assistant", "tool", "assistant"]
    (call,) = sample.messages[2].tool_calls
    assert (call.name, call.parse_arguments()) == ("roulette_wheel", {"square": 18})
    result_message = sample.messages[3]
    assert (result_message.tool_call_id, result_message.name, result_message.text()) == (
        call.id,
        "roulette_wheel",
        "winner",
    )
    assert sample.messages[4].text().startswith("Congratulations!")
    response = sample.response
    assert response is not None
    assert response.usage == Usage(input_tokens=174, output_tokens=31, total_tokens=205)
    assert (response.model_requested, response.finish_reason) == ("gpt-4o", "stop")
    assert sample.metadata["gen_ai.agent.name"] == "roulette_agent"


def check_lf08(result: TraceResult) -> None:
    sample = only(result)
    assert turns(sample) == [("user", "valid message")]
    assert sample.completion() is None
    (note,) = result.dropped
    assert note.path.endswith("gen_ai.prompt.10001.content")
    assert "beyond 1000" in note.reason


def check_lf09(result: TraceResult) -> None:
    sample = only(result)
    assert turns(sample) == [("user", "hello")]
    (note,) = result.dropped
    assert "__proto__" in note.path
    assert b"SUCCESS" not in sample.to_json_bytes()


WEATHER = [
    Message(role="user", content="Weather in Paris?"),
    Message(
        role="assistant",
        content="Absolutely! Let me check the weather for you.",
        tool_calls=[ToolCall(id="1234", name="get_weather", arguments={"location": "Paris"})],
    ),
    Message(role="tool", content="rainy, 57°F", tool_call_id="1234", name="get_weather"),
    Message(
        role="assistant",
        content="The weather in Paris is currently rainy with a temperature of 57°F.",
    ),
]


def check_weather(result: TraceResult) -> None:
    sample = only(result)
    assert [m.canonical() for m in sample.messages] == [m.canonical() for m in WEATHER]
    assert sample.messages[1].tool_calls[0].id == "1234"
    assert sample.messages[2].tool_call_id == "1234"
    assert sample.params.model_dump(exclude_none=True) == {
        "temperature": 0.5,
        "top_p": 0.9,
        "max_tokens": 200,
    }
    assert sample.response is not None
    assert sample.response.usage == Usage(input_tokens=97, output_tokens=52, total_tokens=149)


CHECKS: dict[str, Callable[[TraceResult], None]] = {
    "ot01": check_no_genai,
    "ot02": check_no_genai,
    "ot06": check_ot06,
    "ot07": check_ot07,
    "lf01": check_lf01,
    "lf02": check_lf02,
    "lf03": check_lf03,
    "lf04": check_lf04,
    "lf05": check_lf05,
    "lf06": check_lf06,
    "lf07": check_lf07,
    "lf08": check_lf08,
    "lf09": check_lf09,
    "am01": check_weather,
    "am02": check_weather,
    "am03": check_weather,
}


def otlp_fixture_files() -> list[Path]:
    return sorted(p for p in OTLP.rglob("*") if p.is_file()) if OTLP.is_dir() else []


@needs_fixtures
@pytest.mark.parametrize("path", otlp_fixture_files(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_otlp_fixture(path: Path) -> None:
    check = CHECKS.get(path.name[:4])
    assert check is not None, f"no expectation written for {path.name}"
    body, content_type = fixture_body(path)
    result = run(body, content_type)
    check(result)
    for sample in result.samples:  # what the persister will store reads back the same
        assert Sample.from_json_bytes(sample.to_json_bytes()) == sample


@needs_fixtures
@pytest.mark.parametrize(
    "path",
    [p for p in otlp_fixture_files() if p.suffix == ".json"],
    ids=lambda p: f"{p.parent.name}/{p.name}",
)
def test_every_json_fixture_as_protobuf_gives_the_same_samples(path: Path) -> None:
    body, content_type = fixture_body(path)
    from_json = run(body, content_type)
    from_proto = run(spans_to_proto(decode_export(body, content_type)), PROTO)
    assert [s.model_dump() for s in from_proto.samples] == [
        s.model_dump() for s in from_json.samples
    ]
    assert from_proto.dropped == from_json.dropped


@needs_fixtures
def test_am01_am02_am03_are_the_same_conversation() -> None:
    maps = sorted((OTLP / "attribute-maps").glob("*.json"))
    samples = [only(run(fixture_body(path)[0])) for path in maps]
    assert samples[0].messages == samples[1].messages == samples[2].messages
    assert samples[0].params == samples[1].params
    assert samples[0].content_fingerprint() == samples[1].content_fingerprint()


@needs_fixtures
def test_ot06_openinference_and_ot07_semconv_capture_the_same_call() -> None:
    exports = OTLP / "exports"
    ot06 = only(run((exports / "ot06_interlingua_openinference_openai_captured.json").read_bytes()))
    ot07 = only(
        run(
            (
                exports / "ot07_interlingua_openllmetry_0.62_semconv_messages_captured.json"
            ).read_bytes()
        )
    )
    assert ot06.content_fingerprint() == ot07.content_fingerprint()
    assert ot06.response is not None
    assert ot07.response is not None
    assert ot06.response.usage == ot07.response.usage


# --- semconv reference ------------------------------------------------------------------------------


SCHEMA_ATTRIBUTE = {
    "gen-ai-input-messages.json": "gen_ai.input.messages",
    "gen-ai-output-messages.json": "gen_ai.output.messages",
    "gen-ai-system-instructions.json": "gen_ai.system_instructions",
}
USER_HI = [{"role": "user", "parts": [{"type": "text", "content": "hi"}]}]


def schema_case_span(case: dict[str, Any], *, structured: bool) -> dict[str, Any]:
    """The case's document as the attribute it is a candidate value for."""
    document = case["document"]
    if case["schema"] == "gen-ai-tool-call-arguments.json":
        part = {"type": "tool_call", "id": "c1", "name": "get_weather", "arguments": document}
        key, document = "gen_ai.output.messages", [{"role": "assistant", "parts": [part]}]
    else:
        key = SCHEMA_ATTRIBUTE[case["schema"]]
    attributes: dict[str, Any] = {key: document if structured else orjson.dumps(document).decode()}
    if key == "gen_ai.system_instructions":
        attributes["gen_ai.input.messages"] = orjson.dumps(USER_HI).decode()
    return span_json(attributes)


def schema_cases() -> list[Path]:
    folder = SEMCONV / "schema-cases"
    return sorted(folder.glob("*.yaml")) if folder.is_dir() else []


@needs_fixtures
@pytest.mark.parametrize("structured", [False, True], ids=["json-string", "structured"])
@pytest.mark.parametrize("path", schema_cases(), ids=lambda p: p.stem)
def test_schema_cases_valid_map_invalid_rejected_or_noted(path: Path, structured: bool) -> None:
    case = yaml.safe_load(path.read_text())
    result = run(export_json([schema_case_span(case, structured=structured)]))
    if not case["errors"]:
        assert result.rejected == []
        assert len(result.samples) == 1
        return
    # Each reported error path ($[0].parts ...) shows up in a rejection reason or a note.
    said = [r.reason for r in result.rejected] + [f"{d.path}: {d.reason}" for d in result.dropped]
    wanted = [error["path"].removeprefix("$") for error in case["errors"]]
    assert any(
        (w and w in text) or (not w and "arguments" in text) for w in wanted for text in said
    )


@needs_fixtures
def test_schema_case_details() -> None:
    def case_result(stem: str) -> TraceResult:
        case = yaml.safe_load((SEMCONV / "schema-cases" / f"{stem}.yaml").read_text())
        return run(export_json([schema_case_span(case, structured=False)]))

    reasoning = only(case_result("output-messages-reasoning-and-generic-parts"))
    blocks = reasoning.messages[-1].reasoning
    assert blocks[0].text == "The user wants a short answer."
    assert blocks[1].redacted is not None  # generic redacted_thinking
    round_trip = only(case_result("input-messages-tool-call-round-trip")).messages
    assert (round_trip[2].role, round_trip[2].name, round_trip[2].text()) == (
        "tool",
        "get_weather",
        "rainy, 57°F",
    )
    missing = case_result("input-messages-message-missing-required")
    assert (
        missing.rejected[0].reason
        == "gen_ai.input.messages[0].parts: required (or OpenAI-style content)"
    )
    wrong = case_result("output-messages-wrong-field-types")
    assert wrong.rejected[0].reason == "gen_ai.output.messages[0].finish_reason: must be a string"
    arguments = case_result("tool-call-arguments-not-an-object")
    assert only(arguments).messages[-1].tool_calls[0].parse_arguments() == {"location": "Paris"}
    assert "JSON-encoded string" in arguments.dropped[0].reason


_BLOCK = re.compile(r"```jsonc?\n(.*?)```", re.DOTALL)
_MARKERS = re.compile(
    r'id="gen-ai-(input-messages|output-messages|system-instructions|tool-definitions)'
    r"|### Multimodal (inputs|output) example"
)
_KIND = {"inputs": "input-messages", "output": "output-messages"}
EXAMPLE_ATTRIBUTE = {
    "input-messages": "gen_ai.input.messages",
    "output-messages": "gen_ai.output.messages",
    "system-instructions": "gen_ai.system_instructions",
    "tool-definitions": "gen_ai.tool.definitions",
}


def semconv_examples() -> list[tuple[str, Any]]:
    """(attribute kind, value) for every JSON block of sc01, comments of jsonc removed."""
    path = SEMCONV / "sc01_examples-llm-calls.md"
    if not path.is_file():
        return []
    text = path.read_text()
    examples = []
    for block in _BLOCK.finditer(text):
        marker = list(_MARKERS.finditer(text, 0, block.start()))[-1]
        kind = marker.group(1) or _KIND[marker.group(2)]
        lines = [line for line in block.group(1).splitlines() if not line.strip().startswith("//")]
        examples.append((kind, orjson.loads("\n".join(lines))))
    return examples


@needs_fixtures
def test_semconv_examples_all_map() -> None:
    examples = semconv_examples()
    assert len(examples) >= 20
    samples: list[Sample] = []
    for i, (kind, value) in enumerate(examples):
        attributes = {EXAMPLE_ATTRIBUTE[kind]: orjson.dumps(value).decode()}
        if not kind.endswith("messages"):
            attributes["gen_ai.input.messages"] = orjson.dumps(USER_HI).decode()
        result = run(export_json([span_json(attributes, span_id=f"{i + 1:016x}")]))
        assert result.rejected == [], (kind, value)
        samples.extend(result.samples)
    parts = [part for s in samples for m in s.messages for part in m.content]
    assert any(isinstance(p, ImagePart) and p.url and p.url.startswith("https://") for p in parts)
    assert any(isinstance(p, FilePart) and p.url == "gs://my-bucket/my-video.mp4" for p in parts)
    assert any(isinstance(p, FilePart) and p.file_id == "provider_fileid_123" for p in parts)
    assert any(isinstance(p, ImagePart) and p.data and p.mime_type == "image/png" for p in parts)
    assert any(isinstance(p, AudioPart) and p.mime_type == "audio/wav" for p in parts)
    assert any(
        m.reasoning and m.reasoning[0].text.startswith("Alright")
        for s in samples
        for m in s.messages
    )
    assert any(s.response and s.response.choice_index == 1 for s in samples)  # multiple choices
    assert any(t.name == "get_current_weather" and t.parameters for s in samples for t in s.tools)


# --- assembly ----------------------------------------------------------------------------------------


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "parts": [{"type": "text", "content": text}]}


def say(text: str) -> dict[str, Any]:
    return {
        "role": "assistant",
        "parts": [{"type": "text", "content": text}],
        "finish_reason": "stop",
    }


def call(call_id: str, name: str = "get_weather", **arguments: Any) -> dict[str, Any]:
    part = {"type": "tool_call", "id": call_id, "name": name, "arguments": arguments}
    return {"role": "assistant", "parts": [part], "finish_reason": "tool_call"}


def answer(call_id: str, response: str) -> dict[str, Any]:
    return {
        "role": "tool",
        "parts": [{"type": "tool_call_response", "id": call_id, "response": response}],
    }


def chat(
    span_id: int, start: int, sent: list[Any], got: list[Any] | None, **attrs: Any
) -> dict[str, Any]:
    attributes = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.input.messages": orjson.dumps(sent).decode(),
        **attrs,
    }
    if got is not None:
        attributes["gen_ai.output.messages"] = orjson.dumps(got).decode()
    return span_json(
        attributes, trace_id=TRACE, span_id=f"{span_id:016x}", start=T0 + start, end=T0 + start + 10
    )


def tool(
    span_id: int, start: int, call_id: str | None, result: str, name: str = "get_weather"
) -> dict[str, Any]:
    attributes = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": name,
        "gen_ai.tool.call.result": result,
    }
    if call_id is not None:
        attributes["gen_ai.tool.call.id"] = call_id
    return span_json(
        attributes, trace_id=TRACE, span_id=f"{span_id:016x}", start=T0 + start, end=T0 + start + 5
    )


def http(span_id: int) -> dict[str, Any]:
    return span_json({"http.request.method": "POST"}, trace_id=TRACE, span_id=f"{span_id:016x}")


def test_agent_trace_with_full_history_in_every_call() -> None:
    q = user("Weather in Paris?")
    spans = [
        http(9),
        chat(2, 300, [q, call("c1", location="Paris"), answer("c1", "rainy")], [say("Rainy.")]),
        tool(3, 200, "c1", "rainy"),
        chat(1, 100, [q], [call("c1", location="Paris")]),
    ]
    result = run(export_json(spans))
    sample = only(result)
    assert [m.role for m in sample.messages] == ["user", "assistant", "tool", "assistant"]
    assert sample.messages[2].name == "get_weather"
    assert sample.source_ref.startswith(f"{TRACE}/")
    assert sample.created_at == ns_time(T0 + 300)  # the last model call's start
    assert sample.metadata["otlp.model_calls"] == 2
    assert sample.metadata["otlp.tool_runs"] == 1
    assert result.dropped == []


def test_missing_tool_results_come_from_execute_tool_spans() -> None:
    q = user("Weather in Paris?")
    spans = [
        chat(1, 100, [q], [call("c1", location="Paris")]),
        tool(2, 200, "c1", '{"sky": "rainy"}'),
        chat(3, 300, [q, call("c1", location="Paris"), user("And?")], [say("Rainy.")]),
    ]
    sample = only(run(export_json(spans)))
    assert turns(sample) == [
        ("user", "Weather in Paris?"),
        ("assistant", ""),
        ("tool", '{"sky": "rainy"}'),
        ("user", "And?"),
        ("assistant", "Rainy."),
    ]
    assert sample.messages[2].tool_call_id == "c1"


def test_each_span_keeps_its_own_notes_for_a_shared_history_message() -> None:
    odd = {"role": "user", "parts": [{"type": "text", "content": "Hi"}, {"type": "mystery"}]}
    spans = [
        chat(1, 100, [odd], [say("Hello.")]),
        chat(2, 300, [odd, say("Hello."), user("Bye")], [say("Bye.")]),
    ]
    result = run(export_json(spans))
    assert len(result.samples) == 1
    assert sorted(d.path for d in result.dropped) == [
        f"span[{1:016x}].gen_ai.input.messages[0].parts[1]",
        f"span[{2:016x}].gen_ai.input.messages[0].parts[1]",
    ]


def test_tool_runs_without_ids_pair_by_name() -> None:
    q = user("Weather?")
    first = {
        "role": "assistant",
        "parts": [{"type": "tool_call", "name": "get_weather", "arguments": {}}],
    }
    spans = [
        chat(1, 100, [q], [first]),
        tool(2, 200, None, "sunny"),
        chat(3, 300, [q, first, user("ok")], [say("Sunny.")]),
    ]
    sample = only(run(export_json(spans)))
    assert (sample.messages[2].role, sample.messages[2].name, sample.messages[2].text()) == (
        "tool",
        "get_weather",
        "sunny",
    )


def test_a_call_that_sends_only_the_new_turn_continues_the_conversation() -> None:
    system = {"role": "system", "parts": [{"type": "text", "content": "Be brief."}]}
    spans = [
        chat(1, 100, [system, user("Weather?")], [call("c1")]),
        chat(2, 300, [system, answer("c1", "rainy")], [say("Rainy.")]),
    ]
    sample = only(run(export_json(spans)))
    assert [m.role for m in sample.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert sample.source_ref.startswith(f"{TRACE}/")


def test_final_tool_call_turn_stays_the_completion() -> None:
    result = run(
        export_json([chat(1, 100, [user("Weather?")], [call("c1")]), tool(2, 200, "c1", "rainy")])
    )
    sample = only(result)
    completion = sample.completion()
    assert completion is not None
    assert completion.tool_calls[0].id == "c1"
    assert "final model turn" in result.dropped[0].reason


def test_unrelated_calls_in_one_trace_are_separate_samples() -> None:
    spans = [
        chat(1, 100, [user("Is this spam?")], [say("No.")]),
        chat(2, 200, [user("Summarise it.")], [say("Done.")]),
    ]
    result = run(export_json(spans))
    refs = [s.source_ref for s in result.samples]
    assert len(set(refs)) == 2
    assert all(ref.startswith(f"{TRACE}/") for ref in refs)


def test_agent_span_does_not_duplicate_its_model_calls() -> None:
    agent = chat(
        7, 50, [user("Weather?")], [say("Rainy.")], **{"gen_ai.operation.name": "invoke_agent"}
    )
    agent["endTimeUnixNano"] = str(T0 + 1000)
    spans = [
        agent,
        chat(1, 100, [user("Weather?")], [call("c1")]),
        chat(2, 300, [user("Weather?"), call("c1"), answer("c1", "rainy")], [say("Rainy.")]),
    ]
    result = run(export_json(spans))
    sample = only(result)
    assert len(sample.messages) == 4
    assert result.dropped[0].path == f"span[{7:016x}]"


def test_multiple_choices_give_one_sample_each() -> None:
    result = run(export_json([chat(1, 100, [user("Joke?")], [say("One."), say("Two.")])]))
    first, second = result.samples
    assert first.source_ref == second.source_ref
    assert first.id != second.id
    assert (
        first.response and first.response.choice_index,
        second.response and second.response.choice_index,
    ) == (0, 1)
    assert (first.messages[-1].text(), second.messages[-1].text()) == ("One.", "Two.")
    assert first.messages[:-1] == second.messages[:-1]


def test_failed_call_is_a_prompt_only_error_sample() -> None:
    span = chat(1, 100, [user("Hi")], None, **{"error.type": "RateLimitError"})
    span["status"] = {"code": 2, "message": "429 Too Many Requests"}
    sample = only(run(export_json([span])))
    assert turns(sample) == [("user", "Hi")]
    assert sample.response is not None
    assert (sample.response.status, sample.response.finish_reason) == ("error", "error")
    assert sample.response.error is not None
    assert (sample.response.error.message, sample.response.error.type) == (
        "429 Too Many Requests",
        "RateLimitError",
    )


def test_malformed_content_rejects_that_span_only() -> None:
    bad = chat(1, 100, [user("x")], [say("y")])
    bad["attributes"][2]["value"] = {"stringValue": "[{not json"}
    good = chat(2, 100, [user("Hi")], [say("Hello.")])
    good["traceId"] = "1" * 32
    result = run(export_json([bad, good]))
    (rejected,) = result.rejected
    assert rejected.span_id == f"{1:016x}"
    assert rejected.reason.startswith("gen_ai.input.messages: not valid JSON")
    assert len(result.samples) == 1
    message = summarize_rejections(result.rejected)
    assert message.startswith("1 span(s) rejected: span 0000000000000001: gen_ai.input.messages")
    assert (
        orjson.loads(encode_response(len(result.rejected), message, JSON))["partialSuccess"][
            "rejectedSpans"
        ]
        == "1"
    )


@pytest.mark.parametrize(
    ("attributes", "reason"),
    [
        (
            {"gen_ai.input.messages": '[{"role": "robot", "parts": []}]'},
            "gen_ai.input.messages[0].role: 'robot' is not a role",
        ),
        (
            {
                "gen_ai.input.messages": '[{"role": "user", "parts": [{"type": "blob", "modality": "image", "content": "%%%"}]}]'
            },
            "gen_ai.input.messages[0].parts[0].content: not valid base64",
        ),
        (  # a non-ASCII character: binascii raises a plain ValueError, not binascii.Error
            {
                "gen_ai.input.messages": '[{"role": "user", "parts": [{"type": "blob", "content": "\u0080"}]}]'
            },
            "gen_ai.input.messages[0].parts[0].content: not valid base64",
        ),
        (
            {
                "gen_ai.output.messages": '[{"role": "assistant", "parts": [{"type": "tool_call", "name": "f", "arguments": "{oops"}]}]'
            },
            "gen_ai.output.messages[0].parts[0].arguments: not an object",
        ),
        ({"gen_ai.input.messages": "{}"}, "gen_ai.input.messages: must be an array of messages"),
        (
            {
                "llm.input_messages.0.message.role": "user",
                "llm.input_messages.0.message.tool_calls.0.tool_call.function.arguments": "{}",
            },
            "name: required string",
        ),
        (
            {
                "gen_ai.input.messages": '[{"role": "user", "content": "hi"}]',
                "gen_ai.tool.definitions": '[{"name": "f", "parameters": 3}]',
            },
            "gen_ai.tool.definitions[0].parameters: must be a JSON Schema object",
        ),
    ],
)
def test_malformed_content_reasons_name_the_attribute(
    attributes: dict[str, Any], reason: str
) -> None:
    result = run(export_json([span_json(attributes)]))
    assert result.samples == []
    assert reason in result.rejected[0].reason


def test_oversized_content_attribute_is_rejected_by_name() -> None:
    span = chat(1, 100, [user("x" * 500)], [say("ok")])
    result = run(export_json([span]), limits=Limits(max_value_bytes=200))
    assert result.rejected[0].reason.startswith("gen_ai.input.messages: ")
    assert "size limit" in result.rejected[0].reason


def test_structured_semconv_equals_json_string_form() -> None:
    sent = [user("Weather?"), call("c1", location="Paris"), answer("c1", "rainy")]
    as_text = chat(1, 100, sent, [say("Rainy.")])
    structured = span_json(
        {
            "gen_ai.input.messages": sent,
            "gen_ai.output.messages": [say("Rainy.")],
            "gen_ai.provider.name": "openai",
            "gen_ai.operation.name": "chat",
        },
        trace_id=TRACE,
        span_id=f"{1:016x}",
        start=100,
        end=110,
    )
    assert (
        only(run(export_json([structured]))).messages == only(run(export_json([as_text]))).messages
    )


def test_tenant_comes_from_the_caller_and_ids_are_stable() -> None:
    body = export_json([chat(1, 100, [user("Hi")], [say("Hello.")], tenant="evil")])
    first, second = only(run(body)), only(run(body))
    assert first.tenant == "acme"
    assert first.id == second.id
    with pytest.raises(ValueError, match="tenant"):
        spans_to_samples(decode_export(body, JSON), tenant="Not A Tenant")


# --- other dialects --------------------------------------------------------------------------------


def test_openinference_multimodal_contents_and_tool_messages() -> None:
    attrs = {
        "openinference.span.kind": "LLM",
        "llm.input_messages.0.message.role": "user",
        "llm.input_messages.0.message.contents.0.message_content.type": "text",
        "llm.input_messages.0.message.contents.0.message_content.text": "What is this?",
        "llm.input_messages.0.message.contents.1.message_content.type": "image",
        "llm.input_messages.0.message.contents.1.message_content.image.image.url": "data:image/png;base64,iVBORw0KGgo=",
        "llm.output_messages.0.message.role": "assistant",
        "llm.output_messages.0.message.content": "A PNG header.",
        "llm.tools.0.tool.json_schema": '{"type": "function", "function": {"name": "zoom"}}',
        "llm.invocation_parameters": '{"model": "gpt-4o", "max_completion_tokens": 50, "stop": "END"}',
    }
    sample = only(run(export_json([span_json(attrs)])))
    text, image = sample.messages[0].content
    assert isinstance(text, TextPart)
    assert isinstance(image, ImagePart)
    assert (image.mime_type, image.data) == ("image/png", "iVBORw0KGgo=")
    assert sample.params.max_tokens == 50
    assert sample.params.stop == ["END"]
    assert [t.name for t in sample.tools] == ["zoom"]


def test_legacy_indexed_tool_calls_and_json_content_blocks() -> None:
    attrs = {
        "gen_ai.prompt.0.role": "user",
        "gen_ai.prompt.0.content": '[{"type": "text", "text": "Weather?"}]',
        "gen_ai.prompt.1.role": "assistant",
        "gen_ai.prompt.1.tool_calls.0.id": "c1",
        "gen_ai.prompt.1.tool_calls.0.name": "get_weather",
        "gen_ai.prompt.1.tool_calls.0.arguments": '{"city": "Paris"}',
        "gen_ai.prompt.2.role": "tool",
        "gen_ai.prompt.2.tool_call_id": "c1",
        "gen_ai.prompt.2.content": "rainy",
        "gen_ai.completion.0.role": "assistant",
        "gen_ai.completion.0.content": "Rainy.",
        "gen_ai.completion.0.finish_reason": "stop",
        "gen_ai.usage.prompt_tokens": "12",
    }
    sample = only(run(export_json([span_json(attrs)])))
    assert turns(sample) == [
        ("user", "Weather?"),
        ("assistant", ""),
        ("tool", "rainy"),
        ("assistant", "Rainy."),
    ]
    assert sample.messages[2].name == "get_weather"
    assert sample.response is not None
    assert sample.response.usage == Usage(input_tokens=12)


def test_older_message_events_with_tool_calls() -> None:
    calls = [
        {
            "id": "c1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        }
    ]
    events = [
        {
            "name": "gen_ai.user.message",
            "timeUnixNano": "1",
            "attributes": [{"key": "content", "value": {"stringValue": "Weather?"}}],
        },
        {
            "name": "gen_ai.assistant.message",
            "timeUnixNano": "2",
            "attributes": [
                {"key": "tool_calls", "value": {"stringValue": "x"}},
                {
                    "key": "gen_ai.event.content",
                    "value": {
                        "stringValue": orjson.dumps(
                            {"role": "assistant", "tool_calls": calls}
                        ).decode()
                    },
                },
            ],
        },
        {
            "name": "gen_ai.tool.message",
            "timeUnixNano": "3",
            "attributes": [
                {"key": "content", "value": {"stringValue": "rainy"}},
                {"key": "id", "value": {"stringValue": "c1"}},
            ],
        },
        {
            "name": "gen_ai.choice",
            "timeUnixNano": "4",
            "attributes": [
                {"key": "index", "value": {"intValue": "0"}},
                {"key": "finish_reason", "value": {"stringValue": "stop"}},
                {
                    "key": "message",
                    "value": {
                        "kvlistValue": {
                            "values": [{"key": "content", "value": {"stringValue": "Rainy."}}]
                        }
                    },
                },
            ],
        },
    ]
    sample = only(run(export_json([span_json({"gen_ai.system": "openai"}, events=events)])))
    assert turns(sample) == [
        ("user", "Weather?"),
        ("assistant", ""),
        ("tool", "rainy"),
        ("assistant", "Rainy."),
    ]
    assert sample.messages[1].tool_calls[0].arguments == '{"city": "Paris"}'


def test_openlit_role_prefixed_prompt_and_openai_completion_blob() -> None:
    completion = {
        "choices": [
            {"message": {"role": "assistant", "content": "Fine."}, "finish_reason": "length"}
        ]
    }
    attrs = {
        "gen_ai.prompt": "system: Be nice.\nuser: How are you?\nSecond line.",
        "gen_ai.completion": orjson.dumps(completion).decode(),
    }
    sample = only(run(export_json([span_json(attrs)])))
    assert turns(sample) == [
        ("system", "Be nice."),
        ("user", "How are you?\nSecond line."),
        ("assistant", "Fine."),
    ]
    assert sample.response is not None
    assert sample.response.finish_reason == "length"


def test_blob_parts_url_safe_base64_and_sniffed_mime() -> None:
    png = "iVBORw0KGgo"  # url-safe alphabet needs no change here, but padding is missing
    parts = [
        {"type": "blob", "modality": "image", "content": png},
        {"type": "blob", "modality": "audio", "mime_type": "audio/wav", "content": "-_-_"},
    ]
    sample = only(
        run(
            export_json(
                [
                    span_json(
                        {
                            "gen_ai.input.messages": orjson.dumps(
                                [{"role": "user", "parts": parts}]
                            ).decode()
                        }
                    )
                ]
            )
        )
    )
    image, audio = sample.messages[0].content
    assert isinstance(image, ImagePart)
    assert isinstance(audio, AudioPart)
    assert (image.mime_type, image.data) == ("image/png", "iVBORw0KGgo=")
    assert audio.data == "+/+/"


def test_spans_without_genai_content_are_ignored_quietly() -> None:
    no_content = span_json({"gen_ai.operation.name": "chat", "gen_ai.request.model": "m"})
    result = run(export_json([http(1), no_content]))
    assert (result.samples, result.rejected) == ([], [])
    assert "without message content" in result.dropped[0].reason


# --- hostile content -----------------------------------------------------------------------------

_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "role",
                    "parts",
                    "type",
                    "content",
                    "name",
                    "arguments",
                    "id",
                    "response",
                    "result",
                    "finish_reason",
                    "tool_calls",
                    "function",
                    "modality",
                    "mime_type",
                    "uri",
                    "file_id",
                    "data",
                    "generic_type",
                    "x",
                ]
            ),
            inner,
            max_size=5,
        )
    ),
    max_leaves=25,
)
_roles = st.sampled_from(["user", "assistant", "tool", "system", "model", "robot", None])
_part_types = st.sampled_from(
    [
        "text",
        "tool_call",
        "tool_call_response",
        "blob",
        "uri",
        "file",
        "reasoning",
        "generic",
        "server_tool_call",
        "mystery",
    ]
)
_messages = st.lists(
    st.fixed_dictionaries(
        {
            "role": _roles,
            "parts": st.lists(
                st.fixed_dictionaries(
                    {"type": _part_types},
                    optional={
                        "content": _json,
                        "name": st.text(max_size=5),
                        "arguments": _json,
                        "id": st.text(max_size=3),
                        "response": _json,
                    },
                ),
                max_size=3,
            ),
        },
    ),
    max_size=4,
)
_keys = st.sampled_from(
    [
        "gen_ai.input.messages",
        "gen_ai.output.messages",
        "gen_ai.system_instructions",
        "gen_ai.tool.definitions",
        "gen_ai.prompt",
        "gen_ai.completion",
        "gen_ai.prompt.0.content",
        "gen_ai.prompt.3.role",
        "gen_ai.completion.0.tool_calls.0.name",
        "llm.input_messages.0.message.role",
        "llm.input_messages.0.message.contents.0.message_content.type",
        "llm.output_messages.1.message.tool_calls.0.tool_call.function.arguments",
        "llm.tools.0.tool.json_schema",
        "pydantic_ai.all_messages",
        "gen_ai.usage.input_tokens",
        "gen_ai.request.max_tokens",
        "gen_ai.response.finish_reasons",
        "gen_ai.operation.name",
        "gen_ai.tool.call.result",
        "llm.invocation_parameters",
    ]
)


@settings(max_examples=300, deadline=None)
@given(
    attributes=st.dictionaries(
        _keys,
        _json
        | _messages
        | _messages.map(lambda m: orjson.dumps(m).decode())
        | _json.map(lambda v: orjson.dumps(v).decode()),
        max_size=5,
    ),
    status=st.sampled_from([0, 1, 2]),
)
def test_any_content_gives_samples_or_rejections_never_an_exception(
    attributes: dict[str, Any], status: int
) -> None:
    span = span_json(attributes, status={"code": status})
    result = run(export_json([span, {**span, "spanId": "00000000000000aa"}]))
    assert len(result.samples) + len(result.rejected) <= 4
    for rejected in result.rejected:
        assert rejected.reason


def test_a_conversation_exported_span_by_span_keeps_one_sample_id() -> None:
    """A simple span processor sends each span in its own export request."""
    q = user("Weather in Paris?")
    first_call = chat(1, 100, [q], [call("c1", location="Paris")])
    second_call = chat(
        2, 300, [q, call("c1", location="Paris"), answer("c1", "rainy")], [say("Rainy.")]
    )
    early = only(run(export_json([first_call])))
    late = only(run(export_json([second_call])))
    assert early.id == late.id
    assert len(late.messages) > len(early.messages)

"""One span -> what it contributes to a sample: a model call (`ChatCall`: the messages it sent
and the choices it got; `call_tools` reads the tools it offered), a tool execution (`ToolRun`),
or nothing.

A span without GenAI attributes or events is nothing, cheaply: most spans of a trace are HTTP
or database spans. A GenAI span whose content cannot be read raises `ContentError` naming the
attribute; content left out on purpose is appended to `notes` as (path, reason).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from services.ingest.otlp.export import Span
from services.ingest.otlp.genai_conventions import (
    TOOL_DEFS,
    RawContent,
    details_attributes,
    read_content,
    unflatten,
)
from services.ingest.otlp.genai_messages import (
    ROLES,
    ConversionCache,
    convert_message,
    convert_messages,
    convert_outputs,
)
from services.ingest.otlp.genai_parts import ContentError, Msg, Notes, decode_json, to_json_text

_GENAI_PREFIXES = ("gen_ai.", "llm.", "pydantic_ai.", "openinference.")
_CHAT_OPERATIONS = frozenset({"chat", "text_completion", "generate_content", "invoke_agent"})
# Attributes (or "<event>/<attribute>" for event ones) whose loss would change the messages.
_CONTENT_KEYS = ("messages", "instructions", "prompt", "completion", "content", "message")


@dataclass(slots=True)
class ChatCall:
    """One model call read from a span: the messages it sent and the choices it got back."""

    span: Span
    dialect: str
    input: list[Msg]
    outputs: list[tuple[Msg, str | None]]
    agent_level: bool = False


@dataclass(slots=True)
class ToolRun:
    """An `execute_tool` span: a tool the application ran, with its result."""

    span: Span
    call_id: str | None
    name: str
    result: Any
    used: bool = False


def read_span(
    span: Span, notes: Notes, cache: ConversionCache | None = None
) -> ChatCall | ToolRun | None:
    """What a span contributes: a model call, a tool execution, or nothing. Raises ContentError
    when its GenAI content is malformed. Tool definitions are read later, by `call_tools`, and
    only for the calls a sample is built from."""
    if not _has_genai(span):
        return None
    attrs = span.attributes
    if attrs.get("gen_ai.operation.name") == "execute_tool":
        return _tool_run(span)
    _check_oversized(span)
    content = read_content(span, notes)
    if content is None:
        if _is_model_call(attrs):
            notes.append(("", "a model-call span without message content (capture off?)"))
        return None
    return _chat_call(span, content, notes, cache)


def _has_genai(span: Span) -> bool:
    # A plain loop over the keys rather than any() over a generator: this runs for every span of
    # every trace, and most spans have several attributes.
    for key in span.attributes:
        if key.startswith(_GENAI_PREFIXES):
            return True
    return any(event.name.startswith("gen_ai.") for event in span.events)


def _is_model_call(attrs: dict[str, Any]) -> bool:
    operation = attrs.get("gen_ai.operation.name")
    return (isinstance(operation, str) and operation in _CHAT_OPERATIONS) or attrs.get(
        "openinference.span.kind"
    ) == "LLM"


def _check_oversized(span: Span) -> None:
    """A content attribute the decoder left out for size would make a sample lie by omission."""
    for key, size in span.oversized.items():
        if any(word in key for word in _CONTENT_KEYS):
            raise ContentError(key, f"{size} bytes is over the receiver's attribute size limit")


def _tool_run(span: Span) -> ToolRun:
    attrs = span.attributes
    name = attrs.get("gen_ai.tool.name")
    if not isinstance(name, str) or not name:
        name = span.name.removeprefix("execute_tool").strip() or "tool"
    call_id = attrs.get("gen_ai.tool.call.id")
    result = attrs.get("gen_ai.tool.call.result")
    return ToolRun(span, call_id if isinstance(call_id, str) and call_id else None, name, result)


def _chat_call(
    span: Span, content: RawContent, notes: Notes, cache: ConversionCache | None
) -> ChatCall:
    raw_input, raw_output = content.input, content.output
    if raw_input is not None:
        raw_input = decode_json(raw_input, content.input_path)
    if content.combined and isinstance(raw_input, list) and raw_input:
        raw_input, raw_output = _split_answer(raw_input)
        content.output_path = content.input_path
    messages = (
        [] if raw_input is None else convert_messages(raw_input, content.input_path, notes, cache)
    )
    if content.instructions is not None:
        path = content.instructions_path
        messages[:0] = _instructions(content.instructions, path, notes, cache)
    outputs: list[tuple[Msg, str | None]] = []
    if raw_output is not None:
        decoded = decode_json(raw_output, content.output_path)
        outputs = convert_outputs(decoded, content.output_path, notes, cache)
    pair_tool_results(messages, content.input_path, notes)
    return ChatCall(span, content.dialect, messages, outputs, content.agent_level)


def _split_answer(messages: list[Any]) -> tuple[list[Any], list[Any] | None]:
    """A whole conversation (pydantic-ai) -> (what was sent, the final assistant answer)."""
    last = messages[-1]
    role = last.get("role") if isinstance(last, dict) else None
    if isinstance(role, str) and ROLES.get(role.lower()) == "assistant":
        return messages[:-1], [last]
    return messages, None


def _instructions(
    value: Any, path: str, notes: Notes, cache: ConversionCache | None = None
) -> list[Msg]:
    """`gen_ai.system_instructions`: a part array as the spec says, or a bare string (lf04).
    Every model call of a trace repeats them: through `cache`, they convert once per trace."""
    if isinstance(value, str):
        with contextlib.suppress(ContentError):  # not JSON: the instructions themselves
            value = decode_json(value, path)
    if isinstance(value, str):
        return [{"role": "system", "content": [{"type": "text", "text": value}]}] if value else []
    parts = value if isinstance(value, list) else [value]
    message = {"role": "system", "parts": parts}
    if cache is not None:
        return cache.convert(message, path, notes)
    return convert_message(message, path, notes)


def call_tools(call: ChatCall, notes: Notes) -> list[dict[str, Any]]:
    """The tools a call offered: semconv `gen_ai.tool.definitions`, OpenInference
    `llm.tools.N.tool.json_schema`, or OpenLLMetry's older `llm.request.functions.N.*`.
    Raises ContentError when they cannot be read."""
    span = call.span
    attrs = span.attributes
    value = attrs.get(TOOL_DEFS, details_attributes(span).get(TOOL_DEFS))
    if value is not None:
        return tool_definitions(decode_json(value, TOOL_DEFS), TOOL_DEFS, notes)
    tools = []
    for i, item in unflatten(attrs, "llm.tools.", notes).items():
        path = f"llm.tools.{i}.tool.json_schema"
        tool = tool_definition(decode_json(item.get("tool.json_schema"), path), path, notes)
        if tool is not None:
            tools.append(tool)
    for i, item in unflatten(attrs, "llm.request.functions.", notes).items():
        tool = tool_definition(item, f"llm.request.functions.{i}", notes)
        if tool is not None:
            tools.append(tool)
    return tools


def pair_tool_results(messages: list[Msg], path: str, notes: Notes) -> None:
    """Give each tool result the name (and id, when it has none) of the call it answers: by id,
    else by order among the preceding assistant turn's calls. A result nothing answers to and
    that names nothing is left out, since it cannot be paired."""
    calls: list[dict[str, Any]] = []
    answered = 0
    kept: list[Msg] = []
    for message in messages:
        if message["role"] == "assistant":
            calls, answered = message.get("tool_calls", []), 0
        elif message["role"] == "tool":
            call = _call_for(message, calls, answered)
            answered += 1
            if call is not None:  # a copy: converted dicts may be shared between spans
                call_id = call.get("id")
                if call_id is not None:
                    message = {"tool_call_id": call_id, "name": call["name"], **message}
                else:
                    message = {"name": call["name"], **message}
            if "name" not in message and "tool_call_id" not in message:
                notes.append(
                    (path, "a tool result with no id or name, after no tool call; left out")
                )
                continue
        kept.append(message)
    messages[:] = kept


def _call_for(message: Msg, calls: list[dict[str, Any]], position: int) -> dict[str, Any] | None:
    call_id = message.get("tool_call_id")
    if call_id is not None:
        return next((c for c in calls if c.get("id") == call_id), None)
    if "name" in message:
        return None
    return calls[position] if position < len(calls) else None


def result_message(call: dict[str, Any], run: ToolRun) -> Msg:
    """The tool message for a call, from the execute_tool span that ran it."""
    result = run.result
    text = result if isinstance(result, str) else to_json_text(result)
    message: Msg = {
        "role": "tool",
        "name": call["name"],
        "content": [{"type": "text", "text": text}],
    }
    if call.get("id") is not None:
        message["tool_call_id"] = call["id"]
    return message


def tool_definitions(items: Any, path: str, notes: Notes) -> list[dict[str, Any]]:
    """`gen_ai.tool.definitions` (semconv or OpenAI `{type, function: {...}}` form) -> ToolDef
    dicts. A definition without a name (a built-in tool) is noted and left out."""
    if isinstance(items, dict):
        items = [items]
    if not isinstance(items, list):
        raise ContentError(path, "must be an array of tool definitions")
    tools: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        tool = tool_definition(item, f"{path}[{i}]", notes)
        if tool is not None:
            tools.append(tool)
    return tools


def tool_definition(item: Any, path: str, notes: Notes) -> dict[str, Any] | None:
    if not isinstance(item, dict):
        raise ContentError(path, "must be an object")
    spec = item["function"] if isinstance(item.get("function"), dict) else item
    name = spec.get("name")
    if not isinstance(name, str) or not name:
        notes.append((path, f"a {str(item.get('type'))[:40]!r} tool without a name; left out"))
        return None
    tool: dict[str, Any] = {"name": name}
    if isinstance(spec.get("description"), str):
        tool["description"] = spec["description"]
    parameters = decode_json(spec.get("parameters"), f"{path}.parameters")
    if isinstance(parameters, dict):
        tool["parameters"] = parameters
    elif parameters is not None:
        raise ContentError(f"{path}.parameters", "must be a JSON Schema object")
    if isinstance(spec.get("strict"), bool):
        tool["strict"] = spec["strict"]
    return tool

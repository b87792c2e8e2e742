"""Where each GenAI convention keeps a span's messages, read into one raw shape (`RawContent`).

Readers are tried in order and the first that finds input or output wins, so a span is never
stitched from two dialects: OTel GenAI semconv (span attributes, then the
`gen_ai.client.inference.operation.details` event), Pydantic AI `pydantic_ai.all_messages`,
OpenInference `llm.input_messages.N.*`, legacy indexed `gen_ai.prompt.N.*`, the older
per-message events, OpenLit's `gen_ai.content.*` events, and non-indexed `gen_ai.prompt` /
`gen_ai.completion` blobs. Values stay raw (JSON strings or structures); `genai_messages` converts
them. Flattened keys are parsed into plain dicts keyed by validated integers, so a key such as
`gen_ai.prompt.__proto__.x` (lf09) or index 10001 (lf08) is noted and ignored, never expanded.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from services.ingest.otlp.export import Span
from services.ingest.otlp.genai_parts import ContentError, Notes, decode_json

# Highest message / part / tool index read from flattened keys: bounds hostile input (lf08).
MAX_INDEX = 1000

INPUT, OUTPUT = "gen_ai.input.messages", "gen_ai.output.messages"
INSTRUCTIONS, TOOL_DEFS = "gen_ai.system_instructions", "gen_ai.tool.definitions"
DETAILS_EVENT = "gen_ai.client.inference.operation.details"
_MESSAGE_EVENTS = {
    "gen_ai.system.message": "system",
    "gen_ai.user.message": "user",
    "gen_ai.assistant.message": "assistant",
    "gen_ai.tool.message": "tool",
}
_ROLE_PREFIX = re.compile(r"^(system|user|assistant|tool|developer|human|ai): ", re.MULTILINE)


@dataclass(slots=True)
class RawContent:
    """One span's messages as its convention wrote them. `input` / `output` are lists of
    message dicts (semconv or OpenAI-style) or undecoded JSON; each `*_path` names the source
    for error messages. `combined`: `input` is the whole conversation, answer included."""

    dialect: str
    input: Any = None
    input_path: str = ""
    output: Any = None
    output_path: str = ""
    instructions: Any = None
    instructions_path: str = ""
    combined: bool = False
    agent_level: bool = False


Reader = Callable[[Span, Notes], RawContent | None]


def read_content(span: Span, notes: Notes) -> RawContent | None:
    """The first convention that finds messages on this span, or None."""
    for reader in READERS:
        content = reader(span, notes)
        if content is not None:
            return content
    return None


def details_attributes(span: Span) -> dict[str, Any]:
    """Attributes of the semconv ≥1.37 operation-details event on the span (lf04), or {}."""
    for event in span.events:
        if event.name == DETAILS_EVENT:
            return event.attributes
    return {}


def read_semconv(span: Span, notes: Notes) -> RawContent | None:
    attrs, details = span.attributes, details_attributes(span)
    content = RawContent("semconv")
    content.input, content.input_path = _semconv_value(attrs, details, INPUT)
    content.output, content.output_path = _semconv_value(attrs, details, OUTPUT)
    if content.input is None and content.output is None:
        return None
    content.instructions, content.instructions_path = _semconv_value(attrs, details, INSTRUCTIONS)
    content.agent_level = attrs.get("gen_ai.operation.name") in ("invoke_agent", "create_agent")
    return content


def _semconv_value(attrs: dict[str, Any], details: dict[str, Any], key: str) -> tuple[Any, str]:
    """A semconv attribute and its path: on the span, else on the operation-details event."""
    if key in attrs:
        return attrs[key], key
    if key in details:
        return details[key], f"{DETAILS_EVENT}/{key}"
    return None, ""


def read_pydantic_ai(span: Span, notes: Notes) -> RawContent | None:
    key = "pydantic_ai.all_messages"
    if key not in span.attributes:
        return None
    content = RawContent("pydantic_ai", combined=True, agent_level=True)
    content.input, content.input_path = span.attributes[key], key
    if INSTRUCTIONS in span.attributes:
        content.instructions, content.instructions_path = (
            span.attributes[INSTRUCTIONS],
            INSTRUCTIONS,
        )
    return content


# --- flattened keys -----------------------------------------------------------------------------


def unflatten(
    attrs: dict[str, Any], prefix: str, notes: Notes, *, loose: frozenset[str] = frozenset()
) -> dict[int, dict[str, Any]]:
    """`<prefix><i>.<field>` keys -> {i: {field: value}}. A segment that is not a decimal index
    up to MAX_INDEX is noted and ignored. `loose` fields may also appear without an index
    (`gen_ai.prompt.role`, lf09): they become index -1, read first."""
    items: dict[int, dict[str, Any]] = {}
    for key, value in attrs.items():
        if not key.startswith(prefix):
            continue
        segment, _, rest = key[len(prefix) :].partition(".")
        if segment in loose:
            items.setdefault(-1, {})[key[len(prefix) :]] = value
        elif not (segment.isdecimal() and segment.isascii() and rest):
            notes.append((key, "not an indexed key (<index>.<field>); ignored"))
        elif int(segment) > MAX_INDEX:
            notes.append((key, f"index {int(segment)} is beyond {MAX_INDEX}; ignored"))
        else:
            items.setdefault(int(segment), {})[rest] = value
    return dict(sorted(items.items()))


def _openinference_message(fields: dict[str, Any], notes: Notes, path: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": fields.get("message.role")}
    for src, dst in (("message.name", "name"), ("message.tool_call_id", "tool_call_id")):
        if src in fields:
            message[dst] = fields[src]
    parts = unflatten(fields, "message.contents.", notes)
    if parts:
        message["content"] = [
            _openinference_part(part, f"{path}.message.contents.{j}") for j, part in parts.items()
        ]
    elif "message.content" in fields:
        message["content"] = fields["message.content"]
    calls = unflatten(fields, "message.tool_calls.", notes)
    message["tool_calls"] = [
        {
            "id": call.get("tool_call.id"),
            "function": {
                "name": call.get("tool_call.function.name"),
                "arguments": call.get("tool_call.function.arguments"),
            },
        }
        for call in calls.values()
    ]
    if "message.function_call_name" in fields:
        message["function_call"] = {
            "name": fields["message.function_call_name"],
            "arguments": fields.get("message.function_call_arguments_json"),
        }
    return message


def _openinference_part(fields: dict[str, Any], path: str) -> dict[str, Any]:
    kind = fields.get("message_content.type", "text")
    if kind == "image":
        return {
            "type": "image_url",
            "image_url": {"url": fields.get("message_content.image.image.url")},
        }
    return {"type": kind, "text": fields.get("message_content.text")}


def read_openinference(span: Span, notes: Notes) -> RawContent | None:
    attrs = span.attributes
    content = RawContent("openinference")
    for prefix, slot in (("llm.input_messages.", "input"), ("llm.output_messages.", "output")):
        flat = unflatten(attrs, prefix, notes)
        if flat:
            path = prefix.rstrip(".")
            messages = [_openinference_message(m, notes, f"{path}.{i}") for i, m in flat.items()]
            setattr(content, slot, messages)
            setattr(content, f"{slot}_path", path)
    return content if content.input is not None or content.output is not None else None


_LEGACY_FIELDS = frozenset({"role", "content", "tool_call_id", "name", "finish_reason"})


def _legacy_message(fields: dict[str, Any], notes: Notes, default_role: str) -> dict[str, Any]:
    message = {k: v for k, v in fields.items() if k in _LEGACY_FIELDS}
    message.setdefault("role", default_role)  # lf08 sends content only
    message.setdefault("content", None)
    content = message["content"]
    # OpenLLMetry writes a list of content blocks as JSON text; plain text stays text.
    if isinstance(content, str) and content.startswith("[{"):
        try:
            decoded = orjson.loads(content)
        except orjson.JSONDecodeError:
            decoded = None
        if isinstance(decoded, list) and all(isinstance(p, dict) and "type" in p for p in decoded):
            message["content"] = decoded
    calls = unflatten(fields, "tool_calls.", notes)
    message["tool_calls"] = [
        {"id": c.get("id"), "function": {"name": c.get("name"), "arguments": c.get("arguments")}}
        for c in calls.values()
    ]
    return message


def read_legacy_indexed(span: Span, notes: Notes) -> RawContent | None:
    content = RawContent("gen_ai.prompt.N")
    for prefix, slot, role in (
        ("gen_ai.prompt.", "input", "user"),
        ("gen_ai.completion.", "output", "assistant"),
    ):
        flat = unflatten(span.attributes, prefix, notes, loose=_LEGACY_FIELDS)
        if flat:
            setattr(content, slot, [_legacy_message(m, notes, role) for m in flat.values()])
            setattr(content, f"{slot}_path", prefix.rstrip("."))
    return content if content.input is not None or content.output is not None else None


# --- events ---------------------------------------------------------------------------------------


def _event_message(name: str, attrs: dict[str, Any], path: str) -> dict[str, Any]:
    """One older-semconv message event: fields as attributes, or the whole body as JSON in
    `gen_ai.event.content` (Semantic Kernel before 1.55)."""
    if "gen_ai.event.content" in attrs:
        body = decode_json(attrs["gen_ai.event.content"], f"{path}.gen_ai.event.content")
        fields = body if isinstance(body, dict) else {"content": body}
    else:
        fields = dict(attrs)
    if name == "gen_ai.choice":
        inner = decode_json(fields.get("message"), f"{path}.message")
        message = dict(inner) if isinstance(inner, dict) else {"content": inner}
        message.setdefault("role", "assistant")
        if "finish_reason" in fields:
            message.setdefault("finish_reason", fields["finish_reason"])
        return message
    message = {k: fields[k] for k in ("content", "tool_calls", "name") if k in fields}
    message["role"] = fields.get("role") or _MESSAGE_EVENTS[name]
    message.setdefault("content", None)
    if message["role"] == "tool" and "id" in fields:
        message["tool_call_id"] = fields["id"]
    return message


def read_message_events(span: Span, notes: Notes) -> RawContent | None:
    inputs: list[dict[str, Any]] = []
    choices: list[tuple[int, dict[str, Any]]] = []
    for n, event in enumerate(span.events):
        if event.name in _MESSAGE_EVENTS:
            inputs.append(_event_message(event.name, event.attributes, f"events[{n}]"))
        elif event.name == "gen_ai.choice":
            index = event.attributes.get("index")
            message = _event_message(event.name, event.attributes, f"events[{n}]")
            choices.append((index if isinstance(index, int) else len(choices), message))
    if not inputs and not choices:
        return None
    content = RawContent("gen_ai.*.message events", input_path="events", output_path="events")
    content.input = inputs or None
    content.output = [message for _, message in sorted(choices, key=lambda c: c[0])] or None
    return content


def read_openlit_events(span: Span, notes: Notes) -> RawContent | None:
    content = RawContent("gen_ai.content.* events")
    for event in span.events:
        if event.name == "gen_ai.content.prompt" and "gen_ai.prompt" in event.attributes:
            content.input_path = "gen_ai.content.prompt/gen_ai.prompt"
            content.input = prompt_blob(
                event.attributes["gen_ai.prompt"], content.input_path, notes
            )
        elif event.name == "gen_ai.content.completion" and "gen_ai.completion" in event.attributes:
            path = "gen_ai.content.completion/gen_ai.completion"
            content.output_path = path
            content.output = completion_blob(event.attributes["gen_ai.completion"], path, notes)
    return content if content.input is not None or content.output is not None else None


def read_blobs(span: Span, notes: Notes) -> RawContent | None:
    content = RawContent("gen_ai.prompt blob")
    attrs = span.attributes
    if "gen_ai.prompt" in attrs:
        content.input = prompt_blob(attrs["gen_ai.prompt"], "gen_ai.prompt", notes)
        content.input_path = "gen_ai.prompt"
    if "gen_ai.completion" in attrs:
        content.output = completion_blob(attrs["gen_ai.completion"], "gen_ai.completion", notes)
        content.output_path = "gen_ai.completion"
    return content if content.input is not None or content.output is not None else None


# --- blobs ----------------------------------------------------------------------------------------


def _maybe_json(value: Any, path: str) -> Any:
    """A blob may be JSON text or plain text: only text that opens like JSON is decoded."""
    if isinstance(value, str) and value.lstrip()[:1] in ("[", "{"):
        return decode_json(value, path)
    return value


def prompt_blob(value: Any, path: str, notes: Notes) -> list[Any]:
    """A whole prompt in one value: a message array, `{messages: [...]}`, one message, or text
    in OpenLit's `role: text` lines (lf01)."""
    value = _maybe_json(value, path)
    if isinstance(value, list):
        return value
    if isinstance(value, dict):
        if isinstance(value.get("messages"), list):
            return list(value["messages"])
        if "role" in value:
            return [value]
        notes.append((path, "a JSON object of unknown shape; kept as the user's text"))
        return [{"role": "user", "content": orjson.dumps(value).decode()}]
    if not isinstance(value, str):
        raise ContentError(path, "must be text or JSON")
    return role_prefixed_messages(value)


def completion_blob(value: Any, path: str, notes: Notes) -> list[Any]:
    """A whole completion in one value: messages, an OpenAI response (`choices`), `{text,
    finish_reason}` (am03), or plain text."""
    value = _maybe_json(value, path)
    if isinstance(value, list):
        return value
    if isinstance(value, dict):
        if isinstance(value.get("choices"), list):
            return [_choice(c, f"{path}.choices[{i}]") for i, c in enumerate(value["choices"])]
        if isinstance(value.get("messages"), list):
            return list(value["messages"])
        if "role" in value:
            return [value]
        text = value.get("text", value.get("content"))
        if isinstance(text, str):
            return [
                {"role": "assistant", "content": text, "finish_reason": value.get("finish_reason")}
            ]
        notes.append((path, "a JSON object of unknown shape; kept as the assistant's text"))
        return [{"role": "assistant", "content": orjson.dumps(value).decode()}]
    if not isinstance(value, str):
        raise ContentError(path, "must be text or JSON")
    return [{"role": "assistant", "content": value}]


def _choice(choice: Any, path: str) -> dict[str, Any]:
    if not isinstance(choice, dict) or not isinstance(choice.get("message"), dict):
        raise ContentError(path, "a choice needs a message object")
    message = dict(choice["message"])
    message.setdefault("role", "assistant")
    message["finish_reason"] = choice.get("finish_reason")
    return message


def role_prefixed_messages(text: str) -> list[dict[str, Any]]:
    """OpenLit's "user: ...\\nassistant: ..." text -> messages; text without a role prefix is
    one user message."""
    starts = list(_ROLE_PREFIX.finditer(text))
    if not starts or starts[0].start() != 0:
        return [{"role": "user", "content": text}]
    messages = []
    for match, following in zip(starts, [*starts[1:], None], strict=True):
        end = following.start() - 1 if following is not None else len(text)
        messages.append({"role": match.group(1), "content": text[match.end() : end]})
    return messages


READERS: tuple[Reader, ...] = (
    read_semconv,
    read_pydantic_ai,
    read_openinference,
    read_legacy_indexed,
    read_message_events,
    read_openlit_events,
    read_blobs,
)

"""Chat messages as instrumentations write them -> canonical message dicts (`shared.chat.Message`
fields), ready to validate once as part of a `Sample`.

Two input shapes cover every convention: the OTel GenAI semconv `{role, parts: [...]}` and the
OpenAI-style `{role, content, tool_calls, tool_call_id}` that older conventions, OpenInference
and non-conforming exporters (lf06) use. The dialect readers in `genai_conventions` turn their
attributes into one of these. Malformed content raises `ContentError` naming the attribute path;
content with no canonical form (a `generic` part, a built-in `server_tool_call`) is left out and
a note says so. Plain dicts, not pydantic models: a trace's chat spans repeat the whole history,
so validating per span would be quadratic; the final `Sample` validates once.
"""

from __future__ import annotations

from typing import Any

import orjson

from services.ingest.otlp.genai_parts import (
    ContentError,
    MessageBuilder,
    Msg,
    Notes,
    opt_str,
)

ROLES = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "model": "assistant",
    "ai": "assistant",
    "tool": "tool",
    "function": "tool",
}


class ConversionCache:
    """Per-trace memo of converted messages, keyed by their JSON. Every model call of an agent
    resends the whole history, so without it a trace of n turns converts O(n^2) messages.
    Messages whose conversion left notes are not cached, so each span keeps its own notes."""

    def __init__(self) -> None:
        self._done: dict[bytes, list[Msg]] = {}

    def convert(self, item: Any, path: str, notes: Notes, index: int | None = None) -> list[Msg]:
        """`convert_message` of `item`, memoised. With `index`, the item's path is
        `path[index]`, formatted only when the item is converted, not for a cache hit."""
        try:
            key = orjson.dumps(item)
        except orjson.JSONEncodeError:  # bytes inside a structured value: not worth a key
            return convert_message(item, _item_path(path, index), notes)
        done = self._done.get(key)
        if done is not None:
            return done
        own: Notes = []
        converted = convert_message(item, _item_path(path, index), own)
        if own:
            notes.extend(own)
        else:
            self._done[key] = converted
        return converted


def _item_path(path: str, index: int | None) -> str:
    return path if index is None else f"{path}[{index}]"


def convert_messages(
    items: Any, path: str, notes: Notes, cache: ConversionCache | None = None
) -> list[Msg]:
    """A list of messages (either shape) -> canonical message dicts, in order. Dicts may be
    shared with other spans' results through `cache`: treat them as read-only."""
    if not isinstance(items, list):
        raise ContentError(path, "must be an array of messages")
    messages: list[Msg] = []
    if cache is not None:  # most items are cache hits, so their paths are never formatted
        for i, item in enumerate(items):
            messages.extend(cache.convert(item, path, notes, i))
    else:
        for i, item in enumerate(items):
            messages.extend(convert_message(item, f"{path}[{i}]", notes))
    return messages


def convert_outputs(
    items: Any, path: str, notes: Notes, cache: ConversionCache | None = None
) -> list[tuple[Msg, str | None]]:
    """Output messages (one per choice) with each choice's raw finish reason. Through `cache`,
    a call's answer is the same dict as that message in the next call's history."""
    if not isinstance(items, list):
        raise ContentError(path, "must be an array of messages")
    outputs: list[tuple[Msg, str | None]] = []
    for i, item in enumerate(items):
        if cache is not None:  # a cache hit formats no path
            converted = cache.convert(item, path, notes, i)
        else:
            converted = convert_message(item, f"{path}[{i}]", notes)
        finish = item.get("finish_reason") if isinstance(item, dict) else None
        if finish is not None and not isinstance(finish, str):
            raise ContentError(f"{path}[{i}].finish_reason", "must be a string")
        for message in converted:
            outputs.append((message, finish))
    return outputs


def convert_message(item: Any, path: str, notes: Notes) -> list[Msg]:
    """One message -> one canonical message, or several: each tool result becomes its own tool
    message, as in OpenAI (pydantic-ai puts `tool_call_response` parts in a user turn, lf07)."""
    if not isinstance(item, dict):
        raise ContentError(path, "must be an object")
    role = _role(item.get("role"), path)
    parts = item.get("parts")
    text = _text_only(parts) if role != "tool" and "name" not in item else None
    if text is not None:  # the common case: plain text turns, without the builder
        return [{"role": role, "content": text}]
    builder = MessageBuilder(role, opt_str(item.get("name"), f"{path}.name"))
    if parts is not None:
        if not isinstance(parts, list):
            raise ContentError(f"{path}.parts", "must be an array")
        for j, part in enumerate(parts):
            builder.add_part(part, f"{path}.parts[{j}]", notes)
    elif "content" in item or "tool_calls" in item or "function_call" in item:
        _add_openai_fields(builder, item, path, notes)  # OpenAI-style, no parts (lf06)
    else:
        raise ContentError(f"{path}.parts", "required (or OpenAI-style content)")
    if builder.role == "tool" and builder.tool_call_id is None:
        builder.tool_call_id = opt_str(item.get("tool_call_id") or item.get("id"), f"{path}.id")
    return builder.messages(path, notes)


def _text_only(parts: Any) -> list[dict[str, Any]] | None:
    """Text parts as canonical text parts, or None when anything else is in `parts`."""
    if not isinstance(parts, list) or not parts:
        return None
    content = []
    for part in parts:
        if not isinstance(part, dict) or part.get("type") != "text":
            return None
        text = part.get("content")
        if not isinstance(text, str):
            return None
        content.append({"type": "text", "text": text})
    return content


def _role(value: Any, path: str) -> str:
    """The canonical role of the message at `path` (its `.role` is named only in an error)."""
    role = ROLES.get(value.strip().lower()) if isinstance(value, str) else None
    if role is None:
        if value is None:
            raise ContentError(f"{path}.role", "required")
        reason = f"{str(value)[:40]!r} is not a role (system/user/assistant/tool)"
        raise ContentError(f"{path}.role", reason)
    return role


def _add_openai_fields(
    builder: MessageBuilder, item: dict[str, Any], path: str, notes: Notes
) -> None:
    content = item.get("content")
    if isinstance(content, str):
        builder.content.append({"type": "text", "text": content})
    elif isinstance(content, list):
        for j, part in enumerate(content):
            builder.add_part(part, f"{path}.content[{j}]", notes)
    elif isinstance(content, dict):
        builder.add_part(content, f"{path}.content", notes)
    elif content is not None:
        raise ContentError(f"{path}.content", "must be a string, an array of parts or null")
    calls = item.get("tool_calls")
    if item.get("function_call") is not None:
        calls = [{"function": item["function_call"]}]  # pre-tools OpenAI
    for j, call in enumerate(calls if isinstance(calls, list) else []):
        builder.add_openai_call(call, f"{path}.tool_calls[{j}]")
    if isinstance(item.get("reasoning_content"), str) and item["reasoning_content"]:
        builder.reasoning.append({"text": item["reasoning_content"]})

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

import base64
import binascii
from typing import Any

import orjson

Notes = list[tuple[str, str]]
Msg = dict[str, Any]

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
# Parts a conforming producer may send that have no place in a canonical message.
_UNCARRIED_PARTS = frozenset({"server_tool_call", "server_tool_call_response", "compaction"})
_MAGIC = (
    (b"\x89PNG", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF8", "image/gif"),
    (b"%PDF", "application/pdf"),
)


class ContentError(ValueError):
    """Message content that cannot be read; `path` names the attribute and the spot inside it,
    e.g. `gen_ai.input.messages[1].parts[0].content`."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


def decode_json(value: Any, path: str) -> Any:
    """A content attribute: structured (already list/dict) or a JSON string, possibly encoded
    twice (ot07's workflow span)."""
    if isinstance(value, bytes):
        raise ContentError(path, "must be a JSON string or a structured value, not bytes")
    for _ in range(2):
        if not isinstance(value, str):
            return value
        try:
            value = orjson.loads(value)
        except orjson.JSONDecodeError as exc:
            raise ContentError(path, f"not valid JSON ({exc})") from None
    return value


def to_json_text(value: Any) -> str:
    """Any decoded value as JSON text (bytes as base64), for tool arguments and results."""
    return orjson.dumps(value, default=_json_default).decode()


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    raise TypeError(type(value).__name__)


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
    builder = _Builder(role, _opt_str(item.get("name"), f"{path}.name"))
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
        builder.tool_call_id = _opt_str(item.get("tool_call_id") or item.get("id"), f"{path}.id")
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


def _opt_str(value: Any, path: str) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ContentError(path, "must be a string")
    return value


def _required_str(part: dict[str, Any], key: str, path: str) -> str:
    value = part.get(key)
    if not isinstance(value, str):
        raise ContentError(
            f"{path}.{key}", "required string" if value is None else "must be a string"
        )
    return value


def _add_openai_fields(builder: _Builder, item: dict[str, Any], path: str, notes: Notes) -> None:
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


class _Builder:
    """Collects the parts of one incoming message and emits canonical message dicts."""

    def __init__(self, role: str, name: str | None) -> None:
        self.role = role
        self.name = name
        self.content: list[dict[str, Any]] = []
        self.tool_calls: list[dict[str, Any]] = []
        self.reasoning: list[dict[str, Any]] = []
        self.results: list[Msg] = []
        self.tool_call_id: str | None = None

    def add_part(self, part: Any, path: str, notes: Notes) -> None:
        if not isinstance(part, dict):
            raise ContentError(path, "must be an object")
        kind = part.get("type")
        if not isinstance(kind, str):
            raise ContentError(f"{path}.type", "required string")
        handler = _PART_HANDLERS.get(kind)
        if handler is not None:
            handler(self, part, path, notes)
        elif kind in _UNCARRIED_PARTS or kind == "generic":
            self._generic(part, path, notes)
        else:  # semconv: any other type must be tolerated (GenericPart)
            notes.append((path, f"part type {kind[:40]!r} has no canonical form; left out"))

    def add_openai_call(self, call: Any, path: str) -> None:
        if not isinstance(call, dict):
            raise ContentError(path, "must be an object")
        function: dict[str, Any] = (
            call["function"] if isinstance(call.get("function"), dict) else call
        )
        name = _required_str(function, "name", f"{path}.function")
        arguments = function.get("arguments")
        self.tool_calls.append(
            {
                "id": _opt_str(call.get("id"), f"{path}.id"),
                "name": name,
                "arguments": _arguments(arguments, f"{path}.function.arguments", None),
            }
        )

    def _text(self, part: dict[str, Any], path: str, notes: Notes) -> None:
        key = "content" if "content" in part else "text"  # OpenAI content parts say `text`
        self.content.append({"type": "text", "text": _required_str(part, key, path)})

    def _tool_call(self, part: dict[str, Any], path: str, notes: Notes) -> None:
        name = _required_str(part, "name", path)
        if not name:
            raise ContentError(f"{path}.name", "must not be empty")
        self.tool_calls.append(
            {
                "id": _opt_str(part.get("id"), f"{path}.id"),
                "name": name,
                "arguments": _arguments(part.get("arguments"), f"{path}.arguments", notes),
            }
        )

    def _tool_response(self, part: dict[str, Any], path: str, notes: Notes) -> None:
        if "response" in part:
            response = part["response"]
        elif "result" in part:  # pydantic-ai (lf07)
            response = part["result"]
        else:
            raise ContentError(f"{path}.response", "required")
        result: Msg = {"role": "tool", "content": [_text_part(response)]}
        call_id = _opt_str(part.get("id"), f"{path}.id")
        name = _opt_str(part.get("name"), f"{path}.name")
        if call_id is not None:
            result["tool_call_id"] = call_id
        if name is not None:
            result["name"] = name
        self.results.append(result)

    def _reasoning(self, part: dict[str, Any], path: str, notes: Notes) -> None:
        text = _required_str(part, "content", path)
        if text:
            self.reasoning.append({"text": text})

    def _generic(self, part: dict[str, Any], path: str, notes: Notes) -> None:
        kind = part.get("generic_type") if part.get("type") == "generic" else part.get("type")
        data = part.get("data")
        if kind == "redacted_thinking" and isinstance(data, str) and data:
            self.reasoning.append({"redacted": data})
            return
        notes.append(
            (path, f"{str(kind or 'generic')[:40]!r} part has no canonical form; left out")
        )

    def _blob(self, part: dict[str, Any], path: str, notes: Notes) -> None:
        data = _standard_base64(_required_str(part, "content", path), f"{path}.content")
        mime = _opt_str(part.get("mime_type"), f"{path}.mime_type") or _sniff(data)
        modality = part.get("modality") if isinstance(part.get("modality"), str) else None
        self.content.append({"type": _media_type(modality, mime), "data": data, "mime_type": mime})

    def _uri(self, part: dict[str, Any], path: str, notes: Notes) -> None:
        uri = _required_str(part, "uri", path)
        mime = _opt_str(part.get("mime_type"), f"{path}.mime_type")
        modality = part.get("modality") if isinstance(part.get("modality"), str) else None
        media = {"type": _media_type(modality, mime), "url": uri}
        if mime is not None:
            media["mime_type"] = mime
        self.content.append(media)

    def _file(self, part: dict[str, Any], path: str, notes: Notes) -> None:
        media = {"type": "file", "file_id": _required_str(part, "file_id", path)}
        mime = _opt_str(part.get("mime_type"), f"{path}.mime_type")
        if mime is not None:
            media["mime_type"] = mime
        self.content.append(media)

    def _image_url(self, part: dict[str, Any], path: str, notes: Notes) -> None:
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, dict) else image
        if not isinstance(url, str) or not url:
            raise ContentError(f"{path}.image_url.url", "required string")
        self.content.append({"type": "image", "url": url})

    def messages(self, path: str, notes: Notes) -> list[Msg]:
        """The canonical messages: tool results first (they answer the previous turn), then the
        message itself when it carries anything. Fields its role cannot hold are noted, left out."""
        if self.role == "tool":
            if self.content or not self.results:
                self.results.append(self._tool_message())
            self._drop_assistant_fields(path, notes)
            return self.results
        message: Msg = {"role": self.role, "content": self.content}
        if self.name is not None:
            message["name"] = self.name
        if self.role == "assistant":
            if self.tool_calls:
                message["tool_calls"] = self.tool_calls
            if self.reasoning:
                message["reasoning"] = self.reasoning
        else:
            self._drop_assistant_fields(path, notes)
        if self.results and not (self.content or message.get("tool_calls")):
            return self.results
        return [*self.results, message]

    def _tool_message(self) -> Msg:
        message: Msg = {"role": "tool", "content": self.content}
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            message["name"] = self.name
        return message

    def _drop_assistant_fields(self, path: str, notes: Notes) -> None:
        if self.tool_calls:
            notes.append((path, f"tool calls on a {self.role} message; left out"))
        if self.reasoning:
            notes.append((path, f"reasoning on a {self.role} message; left out"))


_PART_HANDLERS = {
    "text": _Builder._text,
    "input_text": _Builder._text,
    "output_text": _Builder._text,
    "tool_call": _Builder._tool_call,
    "tool_call_response": _Builder._tool_response,
    "reasoning": _Builder._reasoning,
    "blob": _Builder._blob,
    "uri": _Builder._uri,
    "file": _Builder._file,
    "image_url": _Builder._image_url,
}


def _text_part(value: Any) -> dict[str, Any]:
    """A tool result as text: strings as they are, anything else as its JSON."""
    return {"type": "text", "text": value if isinstance(value, str) else to_json_text(value)}


def _arguments(value: Any, path: str, notes: Notes | None) -> str:
    """Tool-call arguments -> the JSON string the canonical ToolCall holds. Semconv sends an
    object; a JSON-encoded string (what providers return) is accepted with a note when `notes`
    is given, i.e. where the convention asked for an object."""
    if value is None:
        return "{}"
    if not isinstance(value, str):
        return to_json_text(value)
    try:
        orjson.loads(value)
    except orjson.JSONDecodeError:
        raise ContentError(path, "not an object, nor a JSON-encoded one") from None
    if notes is not None:
        notes.append((path, "a JSON-encoded string where semconv wants an object; decoded as JSON"))
    return value


def _standard_base64(data: str, path: str) -> str:
    """Inline bytes as standard, padded base64 (url-safe and unpadded input are common)."""
    if data.startswith("data:"):
        data = data.partition(",")[2]
    data = data.strip().replace("-", "+").replace("_", "/")
    data += "=" * (-len(data) % 4)
    try:
        binascii.a2b_base64(data, strict_mode=True)
    except ValueError:  # binascii.Error, or a non-ASCII character
        raise ContentError(path, "not valid base64") from None
    return data


def _sniff(data: str) -> str:
    head = base64.b64decode(data[:16])
    for magic, mime in _MAGIC:
        if head.startswith(magic):
            return mime
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    return "application/octet-stream"


def _media_type(modality: str | None, mime: str | None) -> str:
    kind = modality or (mime or "").partition("/")[0]
    return kind if kind in ("image", "audio") else "file"

"""One chat message's parts, as instrumentations write them -> canonical content, tool calls,
reasoning and tool results (`MessageBuilder`), and the errors and JSON helpers the GenAI readers
share. genai_messages.py reads whole messages with it.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import orjson

Notes = list[tuple[str, str]]
Msg = dict[str, Any]

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


def opt_str(value: Any, path: str) -> str | None:
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


class MessageBuilder:
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
                "id": opt_str(call.get("id"), f"{path}.id"),
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
                "id": opt_str(part.get("id"), f"{path}.id"),
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
        call_id = opt_str(part.get("id"), f"{path}.id")
        name = opt_str(part.get("name"), f"{path}.name")
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
        mime = opt_str(part.get("mime_type"), f"{path}.mime_type") or _sniff(data)
        modality = part.get("modality") if isinstance(part.get("modality"), str) else None
        self.content.append({"type": _media_type(modality, mime), "data": data, "mime_type": mime})

    def _uri(self, part: dict[str, Any], path: str, notes: Notes) -> None:
        uri = _required_str(part, "uri", path)
        mime = opt_str(part.get("mime_type"), f"{path}.mime_type")
        modality = part.get("modality") if isinstance(part.get("modality"), str) else None
        media = {"type": _media_type(modality, mime), "url": uri}
        if mime is not None:
            media["mime_type"] = mime
        self.content.append(media)

    def _file(self, part: dict[str, Any], path: str, notes: Notes) -> None:
        media = {"type": "file", "file_id": _required_str(part, "file_id", path)}
        mime = opt_str(part.get("mime_type"), f"{path}.mime_type")
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
    "text": MessageBuilder._text,
    "input_text": MessageBuilder._text,
    "output_text": MessageBuilder._text,
    "tool_call": MessageBuilder._tool_call,
    "tool_call_response": MessageBuilder._tool_response,
    "reasoning": MessageBuilder._reasoning,
    "blob": MessageBuilder._blob,
    "uri": MessageBuilder._uri,
    "file": MessageBuilder._file,
    "image_url": MessageBuilder._image_url,
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

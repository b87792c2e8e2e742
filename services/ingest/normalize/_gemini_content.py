"""Gemini `Content` objects (`{role, parts}`) as canonical messages, shared by the request's
history and the response's candidates.

Field names come camelCase or snake_case, and `parts` may be one object instead of an array.
A `model` turn is one assistant message (text, inline/file media, `functionCall`s, and
`thought` parts / `thoughtSignature`s as reasoning); a user turn is a user message, with each
`functionResponse` as a tool message of its own, its `response` object kept as JSON text.
"""

from __future__ import annotations

import json

from services.ingest.normalize import NormalizeError
from services.ingest.normalize._json import (
    JsonObject,
    at,
    name,
    obj,
    one_or_many,
    opt_obj,
    opt_text,
    pick,
    text,
)
from services.ingest.normalize._parts import inline_media, kind_of, url_media
from services.ingest.normalize._sample import Notes, build
from shared.chat import ContentPart, Message, ReasoningBlock, TextPart, ToolCall

# Fields that qualify a part's data rather than being data: named in a note only when a part
# holds nothing else.
_PART_FLAGS = {
    "thought",
    "thoughtSignature",
    "thought_signature",
    "videoMetadata",
    "video_metadata",
    "mediaResolution",
    "media_resolution",
    "partMetadata",
    "part_metadata",
}


class _Turn:
    """The messages of one Content, built part by part in order."""

    def __init__(self, role: str, notes: Notes) -> None:
        self.role = role
        self.notes = notes
        self.messages: list[Message] = []
        self.parts: list[ContentPart] = []
        self.calls: list[ToolCall] = []
        self.reasoning: list[ReasoningBlock] = []

    def add(self, where: str, part: JsonObject) -> None:
        if not part:
            self.notes.drop(where, "empty part")
            return
        signature_path, signature = pick(part, where, "thoughtSignature")
        signature = opt_text(signature, signature_path) or None
        if "text" in part:
            self._text(where, part, signature)
            return
        if signature is not None:
            self.reasoning.append(ReasoningBlock(signature=signature))
        self._data(where, part)

    def _text(self, where: str, part: JsonObject, signature: str | None) -> None:
        value = text(part["text"], at(where, "text"))
        if part.get("thought") is True:
            if value or signature:
                self.reasoning.append(ReasoningBlock(text=value, signature=signature))
            return
        if signature is not None:
            self.reasoning.append(ReasoningBlock(signature=signature))
        if value:
            self.parts.append(TextPart(text=value))

    def _data(self, where: str, part: JsonObject) -> None:
        handlers = {
            "inlineData": self._inline_data,
            "fileData": self._file_data,
            "functionCall": self._function_call,
            "functionResponse": self._function_response,
        }
        for camel, handler in handlers.items():
            path, value = pick(part, where, camel)
            if value is None:
                continue
            if self.role == "system" and camel.startswith("function"):
                break
            handler(path, obj(value, path))
            return
        other = sorted(set(part) - _PART_FLAGS)
        self.notes.drop(where, f"part {', '.join(other) or 'without data'} is not carried")

    def _inline_data(self, path: str, blob: JsonObject) -> None:
        mime_path, mime = pick(blob, path, "mimeType")
        data_path, data = pick(blob, path, "data")
        part = inline_media(
            text(data, data_path),
            opt_text(mime, mime_path),
            path=data_path,
            mime_path=mime_path,
            notes=self.notes,
        )
        if part is not None:
            self.parts.append(part)

    def _file_data(self, path: str, file: JsonObject) -> None:
        mime_path, mime = pick(file, path, "mimeType")
        uri_path, uri = pick(file, path, "fileUri")
        mime = opt_text(mime, mime_path)
        part = url_media(
            text(uri, uri_path), path=uri_path, notes=self.notes, kind=kind_of(mime), mime_type=mime
        )
        if part is not None:
            self.parts.append(part)

    def _function_call(self, path: str, call: JsonObject) -> None:
        if self.role != "assistant":
            raise NormalizeError(path, "a function call belongs in a model turn")
        args = opt_obj(call.get("args"), at(path, "args")) or {}
        # Gemini calls usually carry no id: results pair with them by order and name.
        call_id = opt_text(call.get("id"), at(path, "id"))
        self.calls.append(
            build(
                ToolCall,
                path,
                id=call_id,
                name=name(call.get("name"), at(path, "name")),
                arguments=args,
            )
        )

    def _function_response(self, path: str, result: JsonObject) -> None:
        if self.role == "assistant":
            raise NormalizeError(path, "a function response belongs in a user turn")
        self._flush()
        response = result.get("response")
        content = (
            [] if response is None else [TextPart(text=json.dumps(response, ensure_ascii=False))]
        )
        if "parts" in result:
            self.notes.drop(at(path, "parts"), "media parts of a function response are not carried")
        self.messages.append(
            build(
                Message,
                path,
                role="tool",
                name=name(result.get("name"), at(path, "name")),
                tool_call_id=opt_text(result.get("id"), at(path, "id")),
                content=content,
            )
        )

    def _flush(self) -> None:
        if self.parts:
            self.messages.append(Message(role="user", content=self.parts))
            self.parts = []

    def result(self, path: str) -> list[Message]:
        if self.role == "assistant":
            message = build(
                Message,
                path,
                role="assistant",
                content=self.parts,
                tool_calls=self.calls,
                reasoning=self.reasoning,
            )
            return [message]
        if self.reasoning:
            self.notes.drop(path, "thoughts and thought signatures on a user turn are not carried")
        if self.parts or not self.messages:
            self.messages.append(build(Message, path, role=self.role, content=self.parts))
        return self.messages


def content_messages(path: str, content: JsonObject, role: str, notes: Notes) -> list[Message]:
    """The messages of one Content whose role (assistant, user or system) the caller decided."""
    turn = _Turn(role, notes)
    parts_path, parts = pick(content, path, "parts")
    for where, part in one_or_many(parts if parts is not None else [], parts_path):
        turn.add(where, obj(part, where))
    return turn.result(path)

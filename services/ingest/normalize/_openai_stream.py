"""Fold an OpenAI Chat Completions SSE stream back into the `chat.completion` body it stands for,
so streamed and non-streamed answers go through the same normaliser.

Deltas join per choice index: `content`, `refusal` and reasoning text concatenate, and each
`tool_calls[index]` gathers its id, name and `function.arguments` fragments. The usage arrives
in a last chunk with `choices: []` (with `stream_options.include_usage`); `data: [DONE]` ends it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from services.ingest.normalize import NormalizeError
from services.ingest.normalize._json import JsonObject, at, count, loads, obj, opt_arr, opt_obj
from services.ingest.normalize.sse import parse_sse

_TEXT_DELTAS = ("content", "refusal", "reasoning_content", "reasoning")


@dataclass
class _Call:
    id: str | None = None
    name: list[str] = field(default_factory=list)
    arguments: list[str] = field(default_factory=list)


@dataclass
class _Choice:
    texts: dict[str, list[str]] = field(default_factory=dict)
    calls: dict[int, _Call] = field(default_factory=dict)
    legacy_call: _Call | None = None
    finish_reason: Any = None

    def add(self, delta: JsonObject, path: str) -> None:
        for key in _TEXT_DELTAS:
            piece = delta.get(key)
            if piece is not None:
                self.texts.setdefault(key, []).append(_text(piece, at(path, key)))
        for position, raw in enumerate(opt_arr(delta.get("tool_calls"), at(path, "tool_calls"))):
            where = at(at(path, "tool_calls"), position)
            raw = obj(raw, where)
            index = count(raw.get("index"))
            call = self.calls.setdefault(position if index is None else index, _Call())
            _add_call(call, raw, where)
        legacy = opt_obj(delta.get("function_call"), at(path, "function_call"))
        if legacy is not None:
            self.legacy_call = self.legacy_call or _Call()
            _add_call(self.legacy_call, {"function": legacy}, path)

    def message(self) -> JsonObject:
        message: JsonObject = {"role": "assistant"}
        for key, pieces in self.texts.items():
            message[key] = "".join(pieces)
        if self.calls:
            message["tool_calls"] = [_call_body(self.calls[i]) for i in sorted(self.calls)]
        if self.legacy_call is not None:
            message["function_call"] = _call_body(self.legacy_call)["function"]
        return message


def _text(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise NormalizeError(path, "must be a string")
    return value


def _add_call(call: _Call, raw: JsonObject, path: str) -> None:
    if raw.get("id") is not None:
        call.id = _text(raw["id"], at(path, "id"))
    function = opt_obj(raw.get("function"), at(path, "function")) or {}
    if function.get("name") is not None:
        call.name.append(_text(function["name"], at(path, "function.name")))
    if function.get("arguments") is not None:
        call.arguments.append(_text(function["arguments"], at(path, "function.arguments")))


def _call_body(call: _Call) -> JsonObject:
    function = {"name": "".join(call.name), "arguments": "".join(call.arguments)}
    return {"id": call.id, "type": "function", "function": function}


def reassemble(stream: str) -> JsonObject:
    """The `chat.completion` body of a recorded stream, or the `{"error": ...}` chunk that ended
    it. A line that is not a JSON chunk is an error naming the line."""
    body: JsonObject = {}
    choices: dict[int, _Choice] = {}
    chunks = 0
    for event in parse_sse(stream):
        where = f"stream line {event.line}"
        if event.data.strip() == "[DONE]":
            break
        chunk = obj(loads(event.data, where), where)
        if "error" in chunk:
            return chunk
        chunks += 1
        for key in ("id", "model", "usage"):
            if chunk.get(key) is not None:
                body[key] = chunk[key]
        for position, raw in enumerate(opt_arr(chunk.get("choices"), at(where, "choices"))):
            path = at(at(where, "choices"), position)
            raw = obj(raw, path)
            index = count(raw.get("index"))
            choice = choices.setdefault(position if index is None else index, _Choice())
            choice.add(opt_obj(raw.get("delta"), at(path, "delta")) or {}, at(path, "delta"))
            if raw.get("finish_reason") is not None:
                choice.finish_reason = raw["finish_reason"]
    if not chunks:
        raise NormalizeError("stream", "holds no data chunks")
    body["choices"] = [
        {"index": i, "message": choices[i].message(), "finish_reason": choices[i].finish_reason}
        for i in sorted(choices)
    ]
    return body

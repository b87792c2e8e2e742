"""Fold an Anthropic Messages SSE stream back into the `message` body it stands for, so streamed
and non-streamed answers go through the same normaliser.

`message_start` carries the message shell, each `content_block_start` opens a block that its
`content_block_delta`s fill (`text_delta`, `thinking_delta`, `signature_delta`, and
`input_json_delta.partial_json` fragments that only parse once joined), and `message_delta`
brings the stop reason and the final output token count.
"""

from __future__ import annotations

from services.ingest.normalize import NormalizeError
from services.ingest.normalize._json import JsonObject, at, count, loads, obj, opt_obj, text
from services.ingest.normalize._sample import Notes
from services.ingest.normalize.sse import parse_sse

# delta type -> (block field it extends, delta field holding the piece)
_TEXT_DELTAS = {
    "text_delta": ("text", "text"),
    "thinking_delta": ("thinking", "thinking"),
    "signature_delta": ("signature", "signature"),
}
_QUIET_EVENTS = {"ping", "content_block_stop", "message_stop"}


class _Message:
    def __init__(self) -> None:
        self.body: JsonObject | None = None
        self.blocks: dict[int, JsonObject] = {}
        self.json_parts: dict[int, list[str]] = {}

    def start(self, event: JsonObject, where: str) -> None:
        self.body = dict(obj(event.get("message"), at(where, "message")))
        self.body["usage"] = dict(opt_obj(self.body.get("usage"), at(where, "message.usage")) or {})

    def open_block(self, event: JsonObject, where: str) -> None:
        index = _index(event, where)
        self.blocks[index] = dict(obj(event.get("content_block"), at(where, "content_block")))

    def extend_block(self, event: JsonObject, where: str, notes: Notes) -> None:
        index = _index(event, where)
        block = self.blocks.get(index)
        if block is None:
            raise NormalizeError(
                at(where, "index"), f"delta for block {index}, which was not started"
            )
        delta = obj(event.get("delta"), at(where, "delta"))
        kind = delta.get("type")
        if kind == "input_json_delta":
            piece = text(delta.get("partial_json"), at(where, "delta.partial_json"))
            self.json_parts.setdefault(index, []).append(piece)
        elif isinstance(kind, str) and kind in _TEXT_DELTAS:
            field, key = _TEXT_DELTAS[kind]
            piece = text(delta.get(key), at(where, f"delta.{key}"))
            previous = block.get(field)
            block[field] = (previous if isinstance(previous, str) else "") + piece
        else:
            notes.drop(at(where, "delta"), f"{kind!r} deltas are not carried")

    def finish(self, event: JsonObject, where: str) -> None:
        if self.body is None:
            raise NormalizeError(where, "message_delta before message_start")
        delta = opt_obj(event.get("delta"), at(where, "delta")) or {}
        self.body.update({k: v for k, v in delta.items() if v is not None})
        usage = opt_obj(event.get("usage"), at(where, "usage")) or {}
        # The delta's counts are cumulative: they replace the start's.
        self.body["usage"].update({k: v for k, v in usage.items() if v is not None})

    def result(self) -> JsonObject:
        if self.body is None:
            raise NormalizeError("stream", "has no message_start event")
        for index, parts in self.json_parts.items():
            joined = "".join(parts)
            if joined.strip():
                path = f"stream.content[{index}].input"
                self.blocks[index]["input"] = obj(loads(joined, path), path)
        self.body["content"] = [self.blocks[i] for i in sorted(self.blocks)]
        return self.body


def _index(event: JsonObject, where: str) -> int:
    index = count(event.get("index"))
    if index is None:
        raise NormalizeError(at(where, "index"), "must be a non-negative integer")
    return index


def reassemble(stream: str, notes: Notes) -> JsonObject:
    """The message body of a recorded stream, or the `error` event that ended it."""
    message = _Message()
    for event in parse_sse(stream):
        where = f"stream line {event.line}"
        data = obj(loads(event.data, where), where)
        kind = data.get("type", event.event)
        if not isinstance(kind, str):
            raise NormalizeError(at(where, "type"), "must be the event type's name")
        if kind == "message_start":
            message.start(data, where)
        elif kind == "content_block_start":
            message.open_block(data, where)
        elif kind == "content_block_delta":
            message.extend_block(data, where, notes)
        elif kind == "message_delta":
            message.finish(data, where)
        elif kind == "error":
            return data
        elif kind not in _QUIET_EVENTS:
            notes.drop(where, f"unknown stream event {kind!r}")
    return message.result()

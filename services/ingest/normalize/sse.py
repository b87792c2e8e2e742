"""Server-sent events: split a recorded `text/event-stream` body into its events.

All three providers stream over SSE (OpenAI `data:` chunks, Anthropic `event:` + `data:`,
Gemini `data:` with `\\r\\n\\r\\n` separators), and the gateway keeps the raw text of a stream,
so the normalisers parse it after the fact with this one function. It follows the WHATWG
rules (line ends `\\r\\n`, `\\r` or `\\n`; `:` comments; multi-line `data` joined with `\\n`; one
space after the colon dropped) and is tolerant where captures are: a last event without its
closing blank line is still returned.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Only these end a line: str.splitlines() would also split on U+2028 etc., which JSON strings
# may carry raw.
_LINE_END = re.compile(r"\r\n|\r|\n")


@dataclass(frozen=True, slots=True)
class SseEvent:
    """One dispatched event. `event` is None when the stream named no type (the WHATWG default
    "message"); `line` is the 1-based line of the event's first field, for error messages."""

    event: str | None
    data: str
    id: str | None = None
    line: int = 0


class _Pending:
    """The fields of the event being read, until a blank line dispatches it."""

    def __init__(self) -> None:
        self.event: str | None = None
        self.data: list[str] = []
        self.id: str | None = None
        self.line = 0

    def dispatch(self) -> list[SseEvent]:
        # As in browsers, an event without data lines is not dispatched.
        if not self.data:
            return []
        return [SseEvent(self.event, "\n".join(self.data), self.id, self.line)]


def parse_sse(text: str) -> list[SseEvent]:
    """The events of an SSE body, in order."""
    events: list[SseEvent] = []
    pending = _Pending()
    for number, line in enumerate(_LINE_END.split(text.removeprefix("\ufeff")), start=1):
        if not line:
            events += pending.dispatch()
            pending = _Pending()
            continue
        if line.startswith(":"):
            continue
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if pending.line == 0:
            pending.line = number
        if name == "data":
            pending.data.append(value)
        elif name == "event":
            pending.event = value
        elif name == "id" and "\0" not in value:
            pending.id = value
        # `retry` and unknown fields only matter to a live client.
    return events + pending.dispatch()

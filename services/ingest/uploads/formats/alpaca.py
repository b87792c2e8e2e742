"""Alpaca lines (Stanford Alpaca, LLaMA-Factory) -> one conversation.

`{"instruction", "input"?, "output", "system"?, "history"?: [[user, assistant], ...]}` becomes
an optional system message, the history turns, a user message holding the instruction and, when
not empty, the input after a blank line (`instruction + "\\n\\n" + input`, the way the Alpaca
prompt template separates them), and the output as the assistant answer.
"""

from __future__ import annotations

from services.ingest.normalize import NormalizeError
from services.ingest.uploads.formats._common import (
    Chat,
    JsonObject,
    Notes,
    arr,
    at,
    opt_arr,
    opt_text,
    required,
    text,
)
from shared.chat import Message, Role, TextPart

_LINE_KEYS = {"instruction", "input", "output", "system", "history"}


def parse_alpaca(line: JsonObject, notes: Notes) -> Chat:
    instruction = text(required(line, "instruction", "instruction"), "instruction")
    extra = opt_text(line.get("input"), "input") or ""
    output = text(required(line, "output", "output"), "output")
    system = opt_text(line.get("system"), "system")
    prompt = "\n\n".join(part for part in (instruction, extra) if part)
    if not prompt:
        raise NormalizeError("instruction", "must not be empty (and there is no input)")
    if not output:
        raise NormalizeError("output", "must not be empty")
    messages = [_say("system", system)] if system else []
    messages += _history(line)
    messages += [_say("user", prompt), _say("assistant", output)]
    notes.unknown_keys(line, _LINE_KEYS, "")
    return Chat(messages)


def _history(line: JsonObject) -> list[Message]:
    messages = []
    for i, pair in enumerate(opt_arr(line.get("history"), "history")):
        where = at("history", i)
        if len(arr(pair, where)) != 2:
            raise NormalizeError(where, "must be a [user, assistant] pair")
        messages += [
            _say("user", text(pair[0], at(where, 0))),
            _say("assistant", text(pair[1], at(where, 1))),
        ]
    return messages


def _say(role: Role, words: str) -> Message:
    return Message(role=role, content=[TextPart(text=words)] if words else [])

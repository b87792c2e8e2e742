"""ShareGPT lines (as LLaMA-Factory and FastChat write them) -> one conversation.

`{"conversations": [{"from", "value"}, ...], "system"?: str, "tools"?: str | [...]}`, turns
from `human` (user), `gpt` (assistant), `system`, `function_call` (an assistant tool call: value
is JSON `{"name", "arguments"}`, or an array of them for parallel calls), and `observation` /
`tool` (the result of the call before it, paired by order). `user` and `assistant` are read as
`human` and `gpt`. `tools` is a JSON string (LLaMA-Factory) or an array of function
definitions, bare or in OpenAI's `{"type": "function", "function"}` wrapper. A line whose
`messages` hold `from`/`value` turns is read the same way.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from services.ingest.normalize import NormalizeError
from services.ingest.uploads.formats._common import (
    Chat,
    JsonObject,
    Notes,
    arr,
    at,
    build,
    json_text,
    obj,
    opt_text,
    require_assistant,
    required,
    text,
    tool_defs,
)
from services.ingest.uploads.formats.finetune import tool_call
from shared.chat import Message, TextPart, ToolCall, ToolDef

_SPEAKERS = "system, human, gpt, function_call, observation, tool"
_ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "function_call": "call",
    "observation": "tool",
    "tool": "tool",
}
_TURN_KEYS = {"from", "value"}


def turns_key(line: JsonObject) -> str:
    """`conversations`, unless the line holds its turns in `messages` instead."""
    return "messages" if "messages" in line and "conversations" not in line else "conversations"


def parse_sharegpt(line: JsonObject, notes: Notes) -> Chat:
    key = turns_key(line)
    turns = arr(required(line, key, key), key)
    messages = _system(line)
    # Names of the calls not answered yet: an observation answers the oldest.
    pending: deque[str] = deque()
    for i, turn in enumerate(turns):
        where = at(key, i)
        message = _turn(where, obj(turn, where), pending, notes)
        messages.append(message)
    require_assistant(messages, key)
    notes.unknown_keys(line, {key, "system", "tools"}, "")
    return Chat(messages, _tools(line.get("tools")))


def _system(line: JsonObject) -> list[Message]:
    system = opt_text(line.get("system"), "system")
    return [Message(role="system", content=[TextPart(text=system)])] if system else []


def _turn(where: str, turn: JsonObject, pending: deque[str], notes: Notes) -> Message:
    speaker = text(required(turn, "from", at(where, "from")), at(where, "from"))
    role = _ROLES.get(speaker)
    if role is None:
        raise NormalizeError(at(where, "from"), f"{speaker!r} is not one of {_SPEAKERS}")
    value_path = at(where, "value")
    value = required(turn, "value", value_path)
    notes.unknown_keys(turn, _TURN_KEYS, where)
    if role == "call":
        calls = _calls(value, value_path)
        pending.extend(call.name for call in calls)
        return Message(role="assistant", tool_calls=calls)
    content = text(value, value_path)
    if role == "tool":
        if not pending:
            raise NormalizeError(
                where, f"a {speaker} turn must answer a function_call turn before it"
            )
        return build(Message, where, role="tool", name=pending.popleft(), content=content)
    if role == "assistant" and not content:
        raise NormalizeError(value_path, "must not be empty")
    return build(Message, where, role=role, content=content)


def _calls(value: Any, path: str) -> list[ToolCall]:
    """The call(s) of a function_call turn: JSON text (or, leniently, the object itself)."""
    parsed = json_text(value, path) if isinstance(value, str) else value
    items = parsed if isinstance(parsed, list) else [parsed]
    if not items:
        raise NormalizeError(path, "must hold at least one call")
    calls = []
    for i, item in enumerate(items):
        where = at(path, i) if isinstance(parsed, list) else path
        calls.append(tool_call(None, obj(item, where), where))
    return calls


def _tools(value: Any) -> list[ToolDef]:
    if isinstance(value, str):
        value = json_text(value, "tools") if value.strip() else None
    return tool_defs(value, "tools")

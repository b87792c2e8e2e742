"""OpenAI fine-tuning lines -> one conversation.

`{"messages": [...], "tools"?: [...], "parallel_tool_calls"?: bool, "functions"?: [...]}` as
OpenAI's chat fine-tuning takes them: content as a string or parts (`text`, `image_url` with an
https or data URL, `input_audio`, `refusal`), assistant `tool_calls` (and the legacy
`function_call`), `weight` 0/1 on assistant messages, `tool` messages with `tool_call_id`.
Roles are system, user, assistant and tool; `developer` is read as system and the legacy
`function` as tool, as the provider normalisers do.
"""

from __future__ import annotations

from typing import Any

from services.ingest.normalize import NormalizeError
from services.ingest.uploads.formats._common import (
    Chat,
    JsonObject,
    Notes,
    arr,
    at,
    build,
    obj,
    opt_arr,
    opt_bool,
    opt_text,
    require_assistant,
    required,
    text,
    tool_defs,
)
from shared.chat import (
    AudioPart,
    ContentPart,
    ImagePart,
    Message,
    RequestParams,
    TextPart,
    ToolCall,
)

_ROLES = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
    "function": "tool",
}
_LINE_KEYS = {"messages", "tools", "functions", "parallel_tool_calls"}
_MESSAGE_KEYS = {
    "role",
    "content",
    "name",
    "tool_calls",
    "function_call",
    "tool_call_id",
    "weight",
    "refusal",
}
_AUDIO_MIME = {"wav": "audio/wav", "mp3": "audio/mpeg"}


def parse_finetune(line: JsonObject, notes: Notes) -> Chat:
    raw = arr(required(line, "messages", "messages"), "messages")
    messages = [_message(at("messages", i), item, notes) for i, item in enumerate(raw)]
    require_assistant(messages, "messages")
    tools = tool_defs(line.get("tools"), "tools") + tool_defs(line.get("functions"), "functions")
    parallel = opt_bool(line.get("parallel_tool_calls"), "parallel_tool_calls")
    notes.unknown_keys(line, _LINE_KEYS, "")
    return Chat(messages, tools, RequestParams(parallel_tool_calls=parallel))


def _message(path: str, raw: Any, notes: Notes) -> Message:
    raw = obj(raw, path)
    role_path = at(path, "role")
    role_name = text(required(raw, "role", role_path), role_path)
    role = _ROLES.get(role_name)
    if role is None:
        raise NormalizeError(
            role_path, f"{role_name!r} is not one of system, user, assistant, tool"
        )
    content, refusals = _content(raw.get("content"), at(path, "content"), notes)
    fields: dict[str, Any] = {"role": role, "content": content, "name": raw.get("name")}
    for key in ("tool_call_id", "weight"):
        if key in raw:
            fields[key] = raw[key]
    if role == "assistant":
        refusal = opt_text(raw.get("refusal"), at(path, "refusal"))
        refusals += [refusal] if refusal else []
        fields["refusal"] = "".join(refusals) or None
        fields["tool_calls"] = _tool_calls(raw, path)
        if not (content or fields["tool_calls"] or fields["refusal"]):
            raise NormalizeError(path, "an assistant message needs content or tool_calls")
    elif refusals:
        notes.drop(at(path, "content"), f"refusal parts on a {role_name} message are not carried")
    notes.unknown_keys(raw, _MESSAGE_KEYS, path)
    return build(Message, path, **fields)


def _content(value: Any, path: str, notes: Notes) -> tuple[list[ContentPart], list[str]]:
    """Content parts and refusal texts of a message's `content` (string, parts or null)."""
    if value is None:
        return [], []
    if isinstance(value, str):
        return ([TextPart(text=value)] if value else []), []
    parts: list[ContentPart] = []
    refusals: list[str] = []
    for i, raw in enumerate(arr(value, path)):
        where = at(path, i)
        raw = obj(raw, where)
        part_type = text(required(raw, "type", at(where, "type")), at(where, "type"))
        if part_type == "refusal":
            refusals.append(text(raw.get("refusal"), at(where, "refusal")))
        elif (part := _part(part_type, raw, where)) is not None:
            parts.append(part)
        else:
            notes.drop(at(where, "type"), f"unsupported content part type {part_type!r}")
    return parts, refusals


def _part(part_type: str, raw: JsonObject, where: str) -> ContentPart | None:
    if part_type == "text":
        return TextPart(text=text(raw.get("text"), at(where, "text")))
    if part_type == "image_url":
        image = raw.get("image_url")
        path = at(where, "image_url")
        image = {"url": image} if isinstance(image, str) else obj(image, path)
        url = text(image.get("url"), at(path, "url"))
        return build(ImagePart, path, url=url, detail=image.get("detail"))
    if part_type == "input_audio":
        path = at(where, "input_audio")
        audio = obj(raw.get("input_audio"), path)
        audio_format = text(audio.get("format"), at(path, "format"))
        mime = _AUDIO_MIME.get(audio_format, f"audio/{audio_format}")
        return build(AudioPart, path, data=audio.get("data"), mime_type=mime)
    return None


def _tool_calls(raw: JsonObject, path: str) -> list[ToolCall]:
    calls = []
    for i, item in enumerate(opt_arr(raw.get("tool_calls"), at(path, "tool_calls"))):
        where = at(at(path, "tool_calls"), i)
        item = obj(item, where)
        if item.get("type", "function") != "function":
            raise NormalizeError(at(where, "type"), "only function tool calls are supported")
        function = obj(item.get("function"), at(where, "function"))
        calls.append(tool_call(item.get("id"), function, at(where, "function")))
    if (legacy := raw.get("function_call")) is not None:
        calls.append(
            tool_call(None, obj(legacy, at(path, "function_call")), at(path, "function_call"))
        )
    return calls


def tool_call(call_id: Any, function: JsonObject, path: str) -> ToolCall:
    """A call from `{"name", "arguments"}`, arguments a JSON string or an object."""
    arguments = function.get("arguments")
    # A parameterless call is often written with "" or no arguments at all.
    if arguments is None or arguments == "":
        arguments = "{}"
    name = text(required(function, "name", at(path, "name")), at(path, "name"))
    return build(ToolCall, path, id=call_id, name=name, arguments=arguments)

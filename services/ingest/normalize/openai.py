"""OpenAI Chat Completions (`POST /v1/chat/completions`) -> canonical samples.

The request's messages are the prompt; each choice of the response (or of the reassembled SSE
stream) is the final assistant turn of one sample. A failed call (status >= 400, or an
`{"error": ...}` body or stream chunk) is one sample holding the prompt and the error summary.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from services.ingest.normalize import Exchange, Normalized, NormalizeError
from services.ingest.normalize._json import (
    JsonObject,
    arr,
    at,
    count,
    name,
    obj,
    opt_arr,
    opt_bool,
    opt_obj,
    opt_text,
    text,
)
from services.ingest.normalize._openai_stream import reassemble
from services.ingest.normalize._parts import inline_media, media, url_media
from services.ingest.normalize._sample import (
    Answer,
    Notes,
    Reply,
    Request,
    assemble,
    build,
    check_unique_indices,
    error_reply,
    request_params,
    response_source,
)
from shared.chat import (
    ContentPart,
    Message,
    ReasoningBlock,
    TextPart,
    ToolCall,
    ToolDef,
    Usage,
)

_ROLES = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
    "function": "tool",  # the legacy function-calling result
}
# Request fields that map onto RequestParams (later entries win: max_completion_tokens is the
# current name of max_tokens).
_PARAMS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "max_tokens": "max_tokens",
    "max_completion_tokens": "max_tokens",
    "stop": "stop",
    "n": "n",
    "seed": "seed",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "response_format": "response_format",
    "tool_choice": "tool_choice",
    "parallel_tool_calls": "parallel_tool_calls",
    "reasoning_effort": "reasoning_effort",
    "stream": "stream",
}
_NOT_PARAMS = {"messages", "model", "tools", "functions"}
_MESSAGE_KEYS = {
    "role",
    "content",
    "name",
    "tool_calls",
    "function_call",
    "tool_call_id",
    "refusal",
    # vLLM / DeepSeek-style reasoning text
    "reasoning_content",
    "reasoning",
}
_AUDIO_MIME = {"wav": "audio/wav", "mp3": "audio/mpeg"}


def normalize(exchange: Exchange) -> Normalized:
    notes = Notes()
    request = _request(obj(exchange.request, "request"), notes)
    reply = _reply(exchange, notes)
    return Normalized(assemble(exchange, "openai", request, reply), notes.dropped)


# --- request ----------------------------------------------------------------------------------


def _request(body: JsonObject, notes: Notes) -> Request:
    messages = arr(body.get("messages"), "messages")
    if not messages:
        raise NormalizeError("messages", "must not be empty")
    prompt = [_message(at("messages", i), raw, notes) for i, raw in enumerate(messages)]
    mapped = {
        canon: (key, body.get(key)) for key, canon in _PARAMS.items() if body.get(key) is not None
    }
    extras = {k: v for k, v in body.items() if k not in _PARAMS and k not in _NOT_PARAMS}
    return Request(
        prompt=prompt,
        tools=_tools(body, notes),
        params=request_params(mapped, extras),
        model=opt_text(body.get("model"), "model"),
    )


def _message(path: str, raw: Any, notes: Notes) -> Message:
    raw = obj(raw, path)
    role_name = text(raw.get("role"), at(path, "role"))
    role = _ROLES.get(role_name)
    if role is None:
        raise NormalizeError(
            at(path, "role"),
            f"unknown role {role_name!r} (expected system, developer, user, assistant or tool)",
        )
    content, refusals = _content(raw.get("content"), at(path, "content"), notes)
    fields: dict[str, Any] = {"role": role, "content": content}
    fields["name"] = opt_text(raw.get("name"), at(path, "name"))
    if role == "assistant":
        refusal = opt_text(raw.get("refusal"), at(path, "refusal"))
        refusals += [refusal] if refusal else []
        fields["refusal"] = "".join(refusals) if refusals else None
        fields["tool_calls"] = _tool_calls(raw, path, notes)
        fields["reasoning"] = _reasoning(raw, path, notes)
    elif refusals:
        notes.drop(at(path, "content"), f"refusal parts on a {role_name} message are not carried")
    if role == "tool":
        fields["tool_call_id"] = opt_text(raw.get("tool_call_id"), at(path, "tool_call_id"))
        if role_name == "tool" and fields["tool_call_id"] is None:
            raise NormalizeError(at(path, "tool_call_id"), "is required on a tool message")
    notes.unknown_keys(raw, _MESSAGE_KEYS, path)
    return build(Message, path, **fields)


def _content(value: Any, path: str, notes: Notes) -> tuple[list[ContentPart], list[str]]:
    """Content parts and refusal texts of a message's `content` (string, parts or null)."""
    return content_parts(value, path, notes, text_types=("text",), media_part=_media_part)


MediaReader = Callable[[str, JsonObject, str, Notes], ContentPart | None]


def content_parts(
    value: Any, path: str, notes: Notes, *, text_types: tuple[str, ...], media_part: MediaReader
) -> tuple[list[ContentPart], list[str]]:
    """Content parts and refusal texts of a `content` that is a string, parts or null: text
    parts of `text_types`, refusal parts, and whatever `media_part` makes of the rest (it notes
    what it does not carry). Chat Completions and Responses differ only in those part types."""
    if value is None:
        return [], []
    if isinstance(value, str):
        return ([TextPart(text=value)] if value else []), []
    parts: list[ContentPart] = []
    refusals: list[str] = []
    for i, raw in enumerate(arr(value, path)):
        where = at(path, i)
        raw = obj(raw, where)
        kind = text(raw.get("type"), at(where, "type"))
        if kind in text_types:
            parts.append(TextPart(text=text(raw.get("text"), at(where, "text"))))
            if raw.get("annotations"):
                notes.drop(at(where, "annotations"), "annotations are not carried")
        elif kind == "refusal":
            refusals.append(text(raw.get("refusal"), at(where, "refusal")))
        elif (part := media_part(kind, raw, where, notes)) is not None:
            parts.append(part)
    return parts, refusals


def _media_part(kind: str, raw: JsonObject, where: str, notes: Notes) -> ContentPart | None:
    if kind == "image_url":
        image = raw.get("image_url")
        image = {"url": image} if isinstance(image, str) else obj(image, at(where, "image_url"))
        detail = image.get("detail")
        if detail not in (None, "auto", "low", "high"):
            notes.drop(at(where, "image_url.detail"), f"unknown detail {detail!r}")
            detail = None
        url = text(image.get("url"), at(where, "image_url.url"))
        return url_media(
            url, path=at(where, "image_url.url"), notes=notes, kind="image", detail=detail
        )
    if kind == "input_audio":
        return audio_part(raw, where, notes)
    if kind == "file":
        return file_part(obj(raw.get("file"), at(where, "file")), at(where, "file"), notes)
    notes.drop(at(where, "type"), f"unsupported content part type {kind!r}")
    return None


def audio_part(raw: JsonObject, where: str, notes: Notes) -> ContentPart | None:
    """An `input_audio` part (`{data, format}`), as Chat Completions and Responses send it."""
    audio = obj(raw.get("input_audio"), at(where, "input_audio"))
    fmt = text(audio.get("format"), at(where, "input_audio.format"))
    data = text(audio.get("data"), at(where, "input_audio.data"))
    mime = _AUDIO_MIME.get(fmt, f"audio/{fmt}")
    path = at(where, "input_audio.data")
    return inline_media(data, mime, path=path, mime_path=path, notes=notes, kind="audio")


def file_part(file: JsonObject, path: str, notes: Notes) -> ContentPart | None:
    """A file by `file_id`, or inline as `file_data` (base64 or a data URL), with its name."""
    filename = opt_text(file.get("filename"), at(path, "filename"))
    file_id = opt_text(file.get("file_id"), at(path, "file_id"))
    if file_id is not None:
        return media("file", path, file_id=file_id, filename=filename)
    data = text(file.get("file_data"), at(path, "file_data"))
    where = at(path, "file_data")
    if data.startswith("data:"):
        return url_media(data, path=where, notes=notes, kind="file", filename=filename)
    return inline_media(
        data, None, path=where, mime_path=where, notes=notes, kind="file", filename=filename
    )


def _tool_calls(raw: JsonObject, path: str, notes: Notes) -> list[ToolCall]:
    calls = []
    for i, item in enumerate(opt_arr(raw.get("tool_calls"), at(path, "tool_calls"))):
        where = at(at(path, "tool_calls"), i)
        item = obj(item, where)
        kind = item.get("type", "function")
        if kind != "function":
            notes.drop(where, f"{kind!r} tool calls are not carried (only function calls)")
            continue
        call_id = opt_text(item.get("id"), at(where, "id"))
        calls.append(
            function_call(
                call_id, obj(item.get("function"), at(where, "function")), at(where, "function")
            )
        )
    legacy = opt_obj(raw.get("function_call"), at(path, "function_call"))
    if legacy is not None:
        calls.append(function_call(None, legacy, at(path, "function_call")))
    return calls


def function_call(call_id: str | None, function: JsonObject, path: str) -> ToolCall:
    """A call from `{name, arguments}` (a JSON string, "" or absent for none)."""
    arguments = function.get("arguments")
    # A parameterless call may come back as "" (and a stream may send no fragments at all).
    if arguments is None or arguments == "":
        arguments = "{}"
    if not isinstance(arguments, str | dict):
        raise NormalizeError(at(path, "arguments"), "must be a JSON-encoded string")
    return build(
        ToolCall,
        path,
        id=call_id,
        name=name(function.get("name"), at(path, "name")),
        arguments=arguments,
    )


def _reasoning(raw: JsonObject, path: str, notes: Notes) -> list[ReasoningBlock]:
    """Reasoning text of OpenAI-compatible servers (vLLM, DeepSeek); OpenAI itself sends none."""
    blocks = []
    for key in ("reasoning_content", "reasoning"):
        thought = raw.get(key)
        if isinstance(thought, str) and thought:
            blocks.append(ReasoningBlock(text=thought))
        elif thought not in (None, ""):
            notes.drop(at(path, key), f"{key!r} that is not a string is not carried")
    return blocks[:1]  # servers that send both send the same text twice


def _tools(body: JsonObject, notes: Notes) -> list[ToolDef]:
    tools = []
    for i, item in enumerate(opt_arr(body.get("tools"), "tools")):
        where = at("tools", i)
        item = obj(item, where)
        kind = item.get("type", "function")
        if kind != "function":
            notes.drop(where, f"{kind!r} tools are not carried (only function tools)")
            continue
        function = obj(item.get("function"), at(where, "function"))
        tools.append(function_tool(function, at(where, "function")))
    # The legacy `functions` list.
    for i, item in enumerate(opt_arr(body.get("functions"), "functions")):
        tools.append(function_tool(obj(item, at("functions", i)), at("functions", i)))
    return tools


def function_tool(function: JsonObject, path: str) -> ToolDef:
    """A function tool from `{name, description, parameters, strict}`."""
    return build(
        ToolDef,
        path,
        name=name(function.get("name"), at(path, "name")),
        description=opt_text(function.get("description"), at(path, "description")),
        parameters=opt_obj(function.get("parameters"), at(path, "parameters")),
        strict=opt_bool(function.get("strict"), at(path, "strict")),
    )


# --- response ---------------------------------------------------------------------------------


def _reply(exchange: Exchange, notes: Notes) -> Reply:
    if exchange.status >= 400:
        return error_reply(exchange)
    source = response_source(exchange)
    base = "response"
    if isinstance(source, str):
        source, base = reassemble(source), "stream"
    if "error" in source and "choices" not in source:
        return error_reply(exchange, source)
    choices = arr(source.get("choices"), at(base, "choices"))
    if not choices:
        raise NormalizeError(at(base, "choices"), "the response has no choices")
    answers = [_answer(at(at(base, "choices"), i), i, raw, notes) for i, raw in enumerate(choices)]
    check_unique_indices(answers, at(base, "choices"))
    return Reply(
        answers=answers,
        model=opt_text(source.get("model"), at(base, "model")),
        response_id=opt_text(source.get("id"), at(base, "id")),
        usage=usage(source.get("usage"), at(base, "usage"), notes),
    )


def _answer(path: str, position: int, raw: Any, notes: Notes) -> Answer:
    raw = obj(raw, path)
    index = count(raw.get("index"))
    message = opt_obj(raw.get("message"), at(path, "message"))
    if message is not None:
        # Some OpenAI-compatible servers leave the role out of the answer.
        message = {**message, "role": "assistant"}
        for key in ("annotations", "audio"):
            if message.get(key):
                notes.drop(at(at(path, "message"), key), f"{key!r} of the answer are not carried")
        message = {k: v for k, v in message.items() if k not in ("annotations", "audio")}
    if raw.get("logprobs") is not None:
        notes.drop(at(path, "logprobs"), "logprobs are not carried")
    finish = raw.get("finish_reason")
    return Answer(
        index=position if index is None else index,
        message=None if message is None else _message(at(path, "message"), message, notes),
        finish_raw=opt_text(finish, at(path, "finish_reason")),
    )


class UsageKeys(NamedTuple):
    """Where an OpenAI API puts its token counts (Chat Completions and Responses differ)."""

    input: str = "prompt_tokens"
    output: str = "completion_tokens"
    input_details: str = "prompt_tokens_details"
    output_details: str = "completion_tokens_details"


CHAT_USAGE = UsageKeys()


def usage(value: Any, path: str, notes: Notes, keys: UsageKeys = CHAT_USAGE) -> Usage | None:
    """Token counts with OpenAI semantics (cached and reasoning tokens from the details)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        notes.drop(path, "usage is not an object")
        return None
    input_details = value.get(keys.input_details)
    output_details = value.get(keys.output_details)
    return Usage(
        input_tokens=count(value.get(keys.input)),
        output_tokens=count(value.get(keys.output)),
        total_tokens=count(value.get("total_tokens")),
        cached_input_tokens=count(input_details.get("cached_tokens"))
        if isinstance(input_details, dict)
        else None,
        reasoning_tokens=count(output_details.get("reasoning_tokens"))
        if isinstance(output_details, dict)
        else None,
    )

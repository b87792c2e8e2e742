"""Anthropic Messages (`POST /v1/messages`) -> canonical samples.

`system` becomes one system message (a block array keeps its blocks as parts); each
`tool_result` block of a user turn becomes a tool message of its own; `thinking` and
`redacted_thinking` become reasoning; the response (or the reassembled SSE stream) is the final
assistant turn. `cache_control` is a caching hint, not content, so dropping it loses nothing and
is not noted. An assistant turn that ends the request is a prefill that the answer continues:
the sample holds them joined as one assistant turn.
"""

from __future__ import annotations

from typing import Any

from services.ingest.normalize import Exchange, Normalized, NormalizeError
from services.ingest.normalize._anthropic_stream import reassemble
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
from services.ingest.normalize._parts import inline_media, media, url_media
from services.ingest.normalize._sample import (
    Answer,
    Notes,
    Reply,
    Request,
    assemble,
    build,
    error_reply,
    request_params,
    response_source,
)
from shared.chat import ContentPart, Message, ReasoningBlock, TextPart, ToolCall, ToolDef, Usage

_PARAMS = {
    "max_tokens": "max_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "stop_sequences": "stop",
    "stream": "stream",
}
_NOT_PARAMS = {"messages", "system", "model", "tools", "tool_choice"}
# tool_choice in OpenAI's words, so params read the same whatever the provider.
_TOOL_CHOICE = {"auto": "auto", "any": "required", "none": "none"}
_BLOCK_KEYS = {"type", "cache_control"}


def normalize(exchange: Exchange) -> Normalized:
    notes = Notes()
    request = _request(obj(exchange.request, "request"), notes)
    reply = _reply(exchange, notes)
    if reply.error is None and request.prompt[-1].role == "assistant" and reply.answers:
        prefill = request.prompt.pop()
        answer = reply.answers[0]
        answer.message = _continue(prefill, answer.message)
    return Normalized(assemble(exchange, "anthropic", request, reply), notes.dropped)


def _continue(prefill: Message, answer: Message | None) -> Message:
    """The prefilled assistant turn followed by the answer that continues it."""
    if answer is None:
        return prefill
    content = [*prefill.content, *answer.content]
    head, tail = prefill.content[-1:], answer.content[:1]
    if head and tail and isinstance(head[0], TextPart) and isinstance(tail[0], TextPart):
        joined = TextPart(text=head[0].text + tail[0].text)
        content = [*prefill.content[:-1], joined, *answer.content[1:]]
    return answer.model_copy(
        update={
            "content": content,
            "tool_calls": [*prefill.tool_calls, *answer.tool_calls],
            "reasoning": [*prefill.reasoning, *answer.reasoning],
        }
    )


# --- request ----------------------------------------------------------------------------------


def _request(body: JsonObject, notes: Notes) -> Request:
    turns = arr(body.get("messages"), "messages")
    if not turns:
        raise NormalizeError("messages", "must not be empty")
    prompt = _system(body.get("system"), notes)
    for i, turn in enumerate(turns):
        prompt += _turn(at("messages", i), turn, notes)
    mapped = {
        canon: (key, body.get(key)) for key, canon in _PARAMS.items() if body.get(key) is not None
    }
    mapped |= _tool_choice(opt_obj(body.get("tool_choice"), "tool_choice"))
    extras = {k: v for k, v in body.items() if k not in _PARAMS and k not in _NOT_PARAMS}
    return Request(
        prompt=prompt,
        tools=_tools(body, notes),
        params=request_params(mapped, extras),
        model=opt_text(body.get("model"), "model"),
    )


def _tool_choice(choice: JsonObject | None) -> dict[str, tuple[str, Any]]:
    if choice is None:
        return {}
    kind = choice.get("type")
    mapped: dict[str, tuple[str, Any]] = {}
    if kind == "tool":
        function = {"name": name(choice.get("name"), "tool_choice.name")}
        mapped["tool_choice"] = ("tool_choice", {"type": "function", "function": function})
    else:
        mapped["tool_choice"] = (
            "tool_choice",
            _TOOL_CHOICE.get(kind, choice) if isinstance(kind, str) else choice,
        )
    if choice.get("disable_parallel_tool_use") is True:
        mapped["parallel_tool_calls"] = ("tool_choice.disable_parallel_tool_use", False)
    return mapped


def _system(value: Any, notes: Notes) -> list[Message]:
    if value is None or value == "":
        return []
    if isinstance(value, str):
        return [Message(role="system", content=[TextPart(text=value)])]
    parts: list[ContentPart] = []
    for i, block in enumerate(arr(value, "system")):
        where = at("system", i)
        block = obj(block, where)
        if block.get("type") != "text":
            notes.drop(where, f"system block of type {block.get('type')!r} is not carried")
            continue
        parts.append(TextPart(text=text(block.get("text"), at(where, "text"))))
    return [Message(role="system", content=parts)] if parts else []


def _turn(path: str, raw: Any, notes: Notes) -> list[Message]:
    raw = obj(raw, path)
    role = raw.get("role")
    if role not in ("user", "assistant"):
        raise NormalizeError(
            at(path, "role"), f"invalid role {role!r} (expected user or assistant)"
        )
    content = raw.get("content")
    if isinstance(content, str):
        return [Message(role=role, content=[TextPart(text=content)] if content else [])]
    blocks = [
        (at(at(path, "content"), i), obj(b, at(at(path, "content"), i)))
        for i, b in enumerate(arr(content, at(path, "content")))
    ]
    if role == "assistant":
        return [assistant_message(path, blocks, notes)]
    return _user_messages(path, blocks, notes)


def _user_messages(path: str, blocks: list[tuple[str, JsonObject]], notes: Notes) -> list[Message]:
    """A user turn; its tool_result blocks become tool messages, in place."""
    messages: list[Message] = []
    parts: list[ContentPart] = []
    for where, block in blocks:
        if _kind(block, where) == "tool_result":
            if parts:
                messages.append(Message(role="user", content=parts))
                parts = []
            messages.append(_tool_result(where, block, notes))
        elif (part := _part(where, block, notes)) is not None:
            parts.append(part)
    if parts or not messages:
        messages.append(build(Message, path, role="user", content=parts))
    return messages


def assistant_message(path: str, blocks: list[tuple[str, JsonObject]], notes: Notes) -> Message:
    """An assistant turn (request history or response content) as one canonical message."""
    parts: list[ContentPart] = []
    calls: list[ToolCall] = []
    reasoning: list[ReasoningBlock] = []
    for where, block in blocks:
        kind = _kind(block, where)
        if kind == "tool_use":
            calls.append(_tool_use(where, block))
        elif kind == "thinking":
            thought = text(block.get("thinking", ""), at(where, "thinking"))
            signature = opt_text(block.get("signature"), at(where, "signature"))
            reasoning.append(
                build(ReasoningBlock, where, text=thought, signature=signature or None)
            )
        elif kind == "redacted_thinking":
            reasoning.append(
                build(ReasoningBlock, where, redacted=text(block.get("data"), at(where, "data")))
            )
        elif (part := _part(where, block, notes)) is not None:
            parts.append(part)
    return build(
        Message, path, role="assistant", content=parts, tool_calls=calls, reasoning=reasoning
    )


def _kind(block: JsonObject, where: str) -> str:
    return text(block.get("type"), at(where, "type"))


def _tool_use(where: str, block: JsonObject) -> ToolCall:
    arguments = obj(block.get("input", {}), at(where, "input"))
    call_id = text(block.get("id"), at(where, "id"))
    return build(
        ToolCall,
        where,
        id=call_id,
        name=name(block.get("name"), at(where, "name")),
        arguments=arguments,
    )


def _tool_result(where: str, block: JsonObject, notes: Notes) -> Message:
    content = block.get("content")
    parts: list[ContentPart] = []
    if isinstance(content, str):
        parts = [TextPart(text=content)] if content else []
    else:
        for i, item in enumerate(opt_arr(content, at(where, "content"))):
            path = at(at(where, "content"), i)
            if (part := _part(path, obj(item, path), notes)) is not None:
                parts.append(part)
    return build(
        Message,
        where,
        role="tool",
        tool_call_id=text(block.get("tool_use_id"), at(where, "tool_use_id")),
        content=parts,
        is_error=bool(opt_bool(block.get("is_error"), at(where, "is_error"))),
    )


def _part(where: str, block: JsonObject, notes: Notes) -> ContentPart | None:
    """A text, image or document block as a content part; other blocks are noted and skipped."""
    kind = _kind(block, where)
    if kind == "text":
        notes.unknown_keys(block, {*_BLOCK_KEYS, "text"}, where)
        return TextPart(text=text(block.get("text"), at(where, "text")))
    if kind in ("image", "document"):
        notes.unknown_keys(block, {*_BLOCK_KEYS, "source"}, where)
        source = obj(block.get("source"), at(where, "source"))
        return _source(at(where, "source"), source, "image" if kind == "image" else "file", notes)
    notes.drop(where, f"{kind!r} blocks are not carried")
    return None


def _source(path: str, source: JsonObject, kind: str, notes: Notes) -> ContentPart | None:
    source_type = source.get("type")
    if source_type == "base64":
        data = text(source.get("data"), at(path, "data"))
        mime = opt_text(source.get("media_type"), at(path, "media_type"))
        return inline_media(
            data,
            mime,
            path=at(path, "data"),
            mime_path=at(path, "media_type"),
            notes=notes,
            kind="image" if kind == "image" else "file",
        )
    if source_type == "url":
        url = text(source.get("url"), at(path, "url"))
        return url_media(
            url, path=at(path, "url"), notes=notes, kind="image" if kind == "image" else "file"
        )
    if source_type == "file" and kind == "file":
        return media("file", path, file_id=text(source.get("file_id"), at(path, "file_id")))
    if source_type == "text" and kind == "file":
        # A plain-text document is its text.
        return TextPart(text=text(source.get("data"), at(path, "data")))
    notes.drop(path, f"{kind} source of type {source_type!r} is not carried")
    return None


def _tools(body: JsonObject, notes: Notes) -> list[ToolDef]:
    tools = []
    for i, item in enumerate(opt_arr(body.get("tools"), "tools")):
        where = at("tools", i)
        item = obj(item, where)
        if item.get("type") not in (None, "custom"):
            # Server tools (web_search_20250305, bash_..., ...) run at Anthropic: no schema here.
            notes.drop(where, f"server tool {item.get('type')!r} is not carried")
            continue
        tools.append(
            build(
                ToolDef,
                where,
                name=name(item.get("name"), at(where, "name")),
                description=opt_text(item.get("description"), at(where, "description")),
                parameters=opt_obj(item.get("input_schema"), at(where, "input_schema")),
            )
        )
    return tools


# --- response ---------------------------------------------------------------------------------


def _reply(exchange: Exchange, notes: Notes) -> Reply:
    if exchange.status >= 400:
        return error_reply(exchange)
    source = response_source(exchange)
    base = "response"
    if isinstance(source, str):
        source, base = reassemble(source, notes), "stream"
    if source.get("type") == "error" or ("error" in source and "content" not in source):
        return error_reply(exchange, source)
    blocks = [
        (at(at(base, "content"), i), obj(b, at(at(base, "content"), i)))
        for i, b in enumerate(arr(source.get("content"), at(base, "content")))
    ]
    message = assistant_message(base, blocks, notes)
    stop = opt_text(source.get("stop_reason"), at(base, "stop_reason"))
    return Reply(
        answers=[Answer(index=0, message=message, finish_raw=stop)],
        model=opt_text(source.get("model"), at(base, "model")),
        response_id=opt_text(source.get("id"), at(base, "id")),
        usage=_usage(source.get("usage"), at(base, "usage"), notes),
    )


def _usage(value: Any, path: str, notes: Notes) -> Usage | None:
    """Anthropic's input_tokens leave out cache reads and writes; ours include them."""
    if value is None:
        return None
    if not isinstance(value, dict):
        notes.drop(path, "usage is not an object")
        return None
    fresh = count(value.get("input_tokens"))
    written = count(value.get("cache_creation_input_tokens")) or 0
    read = count(value.get("cache_read_input_tokens")) or 0
    output = count(value.get("output_tokens"))
    total_input = None if fresh is None else fresh + written + read
    return Usage(
        input_tokens=total_input,
        output_tokens=output,
        total_tokens=None if total_input is None or output is None else total_input + output,
        cached_input_tokens=None if fresh is None else read,
    )

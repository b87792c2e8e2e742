"""OpenAI Responses (`POST /v1/responses`) -> canonical samples.

The Responses API speaks in items rather than messages: `instructions` is the system prompt,
`input` a string (one user turn) or a list of message items, `function_call` and
`function_call_output` items, and `reasoning` items; the answer's `output` is a list of the same
kinds. Consecutive assistant-side items (reasoning, an assistant message, function calls) are
one assistant turn in our terms, as Chat Completions would have sent them; a function call's
output is a tool message. A streamed answer is read from its final `response.completed` (or
`.incomplete` / `.failed`) event, which carries the whole response. One sample per call: the
Responses API has no `n`.

A request that continues a stored conversation (`previous_response_id`) holds only the new turn:
its sample is kept, with a note in the fidelity report, and the id stays in the params.
"""

from __future__ import annotations

from typing import Any

from services.ingest.normalize import Exchange, Normalized, NormalizeError
from services.ingest.normalize._json import (
    JsonObject,
    at,
    loads,
    obj,
    opt_arr,
    opt_obj,
    opt_text,
    text,
)
from services.ingest.normalize._parts import media, url_media
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
from services.ingest.normalize.openai import (
    UsageKeys,
    audio_part,
    content_parts,
    file_part,
    function_call,
    function_tool,
    usage,
)
from services.ingest.normalize.sse import parse_sse
from shared.chat import ContentPart, Message, ReasoningBlock, TextPart, ToolDef

_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
_PARAMS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "max_output_tokens": "max_tokens",
    "tool_choice": "tool_choice",
    "parallel_tool_calls": "parallel_tool_calls",
    "stream": "stream",
}
_NOT_PARAMS = {"input", "instructions", "model", "tools", "reasoning"}
# Input text, and the model's own text when earlier answers are sent back as history.
_TEXT_PARTS = ("input_text", "output_text", "text")
_FINAL_EVENTS = ("response.completed", "response.incomplete", "response.failed")
_USAGE_KEYS = UsageKeys("input_tokens", "output_tokens", "input_tokens_details",
                        "output_tokens_details")  # fmt: skip
_CONTINUED = (
    "the earlier turns are stored at OpenAI (previous_response_id), not in this request: "
    "the sample holds only this request's input"
)


def normalize(exchange: Exchange) -> Normalized:
    notes = Notes()
    request = _request(obj(exchange.request, "request"), notes)
    reply = _reply(exchange, notes)
    return Normalized(assemble(exchange, "openai", request, reply), notes.dropped)


# --- request ----------------------------------------------------------------------------------


def _request(body: JsonObject, notes: Notes) -> Request:
    prompt: list[Message] = []
    instructions = opt_text(body.get("instructions"), "instructions")
    if instructions:
        prompt.append(Message(role="system", content=[TextPart(text=instructions)]))
    raw_input = body.get("input")
    if isinstance(raw_input, str):
        prompt.append(Message(role="user", content=[TextPart(text=raw_input)] if raw_input else []))
    else:
        prompt += _items(opt_arr(raw_input, "input"), "input", notes)
    if not prompt:
        raise NormalizeError("input", "must not be empty")
    if body.get("previous_response_id") is not None:
        notes.drop("previous_response_id", _CONTINUED)
    mapped = {
        canon: (key, body.get(key)) for key, canon in _PARAMS.items() if body.get(key) is not None
    }
    reasoning = opt_obj(body.get("reasoning"), "reasoning") or {}
    if isinstance(reasoning.get("effort"), str):
        mapped["reasoning_effort"] = ("reasoning.effort", reasoning["effort"])
    extras = {k: v for k, v in body.items() if k not in _PARAMS and k not in _NOT_PARAMS}
    return Request(
        prompt=prompt,
        tools=_tools(body, notes),
        params=request_params(mapped, extras),
        model=opt_text(body.get("model"), "model"),
    )


class _Turns:
    """Messages made from items, folding consecutive assistant-side items into one turn."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self._assistant: dict[str, Any] | None = None
        self._assistant_path = ""

    def assistant(self, path: str) -> dict[str, Any]:
        if self._assistant is None:
            self._assistant = {"content": [], "tool_calls": [], "reasoning": [], "refusal": None}
            self._assistant_path = path
        return self._assistant

    def add(self, message: Message) -> None:
        self.close()
        self.messages.append(message)

    def close(self) -> None:
        if self._assistant is not None:
            fields, self._assistant = self._assistant, None
            self.messages.append(build(Message, self._assistant_path, role="assistant", **fields))


def _items(items: list[Any], path: str, notes: Notes) -> list[Message]:
    turns = _Turns()
    for i, raw in enumerate(items):
        _item(turns, obj(raw, at(path, i)), at(path, i), notes)
    turns.close()
    return turns.messages


def _item(turns: _Turns, raw: JsonObject, path: str, notes: Notes) -> None:
    kind = raw.get("type", "message")
    if kind == "message":
        _message(turns, raw, path, notes)
    elif kind == "function_call":
        call_id = text(raw.get("call_id"), at(path, "call_id"))
        turns.assistant(path)["tool_calls"].append(function_call(call_id, raw, path))
    elif kind == "function_call_output":
        call_id = text(raw.get("call_id"), at(path, "call_id"))
        content = _content(raw.get("output"), at(path, "output"), notes)[0]
        turns.add(build(Message, path, role="tool", tool_call_id=call_id, content=content))
    elif kind == "reasoning":
        block = _reasoning(raw, path)
        if block is not None:
            turns.assistant(path)["reasoning"].append(block)
    else:
        notes.drop(at(path, "type"), f"{kind!r} items are not carried")


def _message(turns: _Turns, raw: JsonObject, path: str, notes: Notes) -> None:
    role_name = text(raw.get("role"), at(path, "role"))
    role = _ROLES.get(role_name)
    if role is None:
        raise NormalizeError(
            at(path, "role"),
            f"unknown role {role_name!r} (expected system, developer, user or assistant)",
        )
    content, refusals = _content(raw.get("content"), at(path, "content"), notes)
    if role != "assistant":
        if refusals:
            notes.drop(
                at(path, "content"), f"refusal parts on a {role_name} message are not carried"
            )
        turns.add(build(Message, path, role=role, content=content))
        return
    turn = turns.assistant(path)
    turn["content"] += content
    if refusals:
        turn["refusal"] = "".join([turn["refusal"] or "", *refusals])


def _content(value: Any, path: str, notes: Notes) -> tuple[list[ContentPart], list[str]]:
    """Content parts and refusal texts of an item's `content` (or a function call's output)."""
    return content_parts(value, path, notes, text_types=_TEXT_PARTS, media_part=_media_part)


def _media_part(kind: str, raw: JsonObject, where: str, notes: Notes) -> ContentPart | None:
    if kind == "input_image":
        detail = raw.get("detail")
        if detail not in (None, "auto", "low", "high"):
            notes.drop(at(where, "detail"), f"unknown detail {detail!r}")
            detail = None
        file_id = opt_text(raw.get("file_id"), at(where, "file_id"))
        if file_id is not None:
            return media("image", where, file_id=file_id, detail=detail)
        url = text(raw.get("image_url"), at(where, "image_url"))
        return url_media(url, path=at(where, "image_url"), notes=notes, kind="image", detail=detail)
    if kind == "input_file":
        return _file_part(raw, where, notes)
    if kind == "input_audio":
        return audio_part(raw, where, notes)
    notes.drop(at(where, "type"), f"unsupported content part type {kind!r}")
    return None


def _file_part(raw: JsonObject, where: str, notes: Notes) -> ContentPart | None:
    """An `input_file`: Chat Completions' file fields, or a `file_url`."""
    file_url = opt_text(raw.get("file_url"), at(where, "file_url"))
    if file_url is None:
        return file_part(raw, where, notes)
    filename = opt_text(raw.get("filename"), at(where, "filename"))
    return url_media(
        file_url, path=at(where, "file_url"), notes=notes, kind="file", filename=filename
    )


def _reasoning(raw: JsonObject, path: str) -> ReasoningBlock | None:
    """A reasoning item: its summary texts (OpenAI shows no raw chain of thought) and, when the
    caller asked for it, the encrypted content that lets a later request resume it."""
    where = at(path, "summary")
    summary = [
        text(obj(part, at(where, i)).get("text"), at(at(where, i), "text"))
        for i, part in enumerate(opt_arr(raw.get("summary"), where))
    ]
    encrypted = opt_text(raw.get("encrypted_content"), at(path, "encrypted_content"))
    if not summary and encrypted is None:
        return None
    return build(ReasoningBlock, path, text="\n\n".join(summary), redacted=encrypted)


def _tools(body: JsonObject, notes: Notes) -> list[ToolDef]:
    tools = []
    for i, item in enumerate(opt_arr(body.get("tools"), "tools")):
        where = at("tools", i)
        item = obj(item, where)
        kind = item.get("type", "function")
        if kind != "function":
            notes.drop(where, f"{kind!r} tools are not carried (only function tools)")
            continue
        tools.append(function_tool(item, where))
    return tools


# --- response ---------------------------------------------------------------------------------


def _reply(exchange: Exchange, notes: Notes) -> Reply:
    if exchange.status >= 400:
        return error_reply(exchange)
    source = response_source(exchange)
    base = "response"
    if isinstance(source, str):
        source, base = _final_response(source), "stream"
    if source.get("status") == "failed" or ("error" in source and "output" not in source):
        return error_reply(exchange, {"error": source.get("error")})
    turns = _Turns()
    for i, raw in enumerate(opt_arr(source.get("output"), at(base, "output"))):
        where = at(at(base, "output"), i)
        raw = obj(raw, where)
        if raw.get("type", "message") == "message":
            raw = {**raw, "role": "assistant"}  # the answer is the model's, whatever it says
        _item(turns, raw, where, notes)
    turns.close()
    if len(turns.messages) > 1:
        notes.drop(at(base, "output"), "output items after a tool result are not carried")
    message = turns.messages[0] if turns.messages else None
    return Reply(
        answers=[Answer(index=0, message=message, finish_raw=_finish_raw(source, base))],
        model=opt_text(source.get("model"), at(base, "model")),
        response_id=opt_text(source.get("id"), at(base, "id")),
        usage=usage(source.get("usage"), at(base, "usage"), notes, _USAGE_KEYS),
    )


def _final_response(stream: str) -> JsonObject:
    """The whole response a Responses stream ends with (its last completed/incomplete/failed
    event), or the error of an `error` event."""
    final: JsonObject | None = None
    for event in parse_sse(stream):
        where = f"stream line {event.line}"
        data = loads(event.data, where) if event.data != "[DONE]" else None
        if not isinstance(data, dict):
            continue
        kind = data.get("type", event.event)
        if kind == "error":
            return {"status": "failed", "error": data.get("error") or data}
        if kind in _FINAL_EVENTS:
            final = obj(data.get("response"), at(where, "response"))
    if final is None:
        raise NormalizeError("stream", "no response.completed event: the stream ended early")
    return final


def _finish_raw(source: JsonObject, base: str) -> str | None:
    """`completed`, or why the response is incomplete (`max_output_tokens`, `content_filter`)."""
    status = opt_text(source.get("status"), at(base, "status"))
    if status == "incomplete":
        details = opt_obj(source.get("incomplete_details"), at(base, "incomplete_details")) or {}
        return opt_text(details.get("reason"), at(base, "incomplete_details.reason")) or status
    return status

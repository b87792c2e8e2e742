"""Gemini generateContent / streamGenerateContent (generativelanguage and Vertex) -> canonical
samples.

The model is named in the URL (`Exchange.model_from_path`). `contents` is the prompt, with
`systemInstruction` as the system message and role `model` as assistant; each response
candidate is the final assistant turn of one sample. The REST API takes camelCase and
snake_case names and a single object where an array is expected (the official samples send
`"contents": {...}`); both are read here. Helpers: `_gemini_content` (parts), `_gemini_schema`
(function schemas), `_gemini_reply` (responses and streams).
"""

from __future__ import annotations

from typing import Any

from services.ingest.normalize import Exchange, Normalized, NormalizeError
from services.ingest.normalize._gemini_content import content_messages
from services.ingest.normalize._gemini_reply import reply
from services.ingest.normalize._gemini_schema import json_schema
from services.ingest.normalize._json import (
    JsonObject,
    arr,
    at,
    name,
    obj,
    one_or_many,
    opt_obj,
    opt_text,
    pick,
    snake_case,
)
from services.ingest.normalize._sample import Notes, Request, assemble, build, request_params
from shared.chat import Message, RequestParams, TextPart, ToolDef

_ROLES = {"user": "user", "model": "assistant", "function": "user"}  # "function": legacy results
# generationConfig fields that map onto RequestParams; the rest are kept in snake_case.
_GENERATION = {
    "temperature": "temperature",
    "topP": "top_p",
    "topK": "top_k",
    "maxOutputTokens": "max_tokens",
    "stopSequences": "stop",
    "candidateCount": "n",
    "seed": "seed",
    "presencePenalty": "presence_penalty",
    "frequencyPenalty": "frequency_penalty",
}
_NOT_PARAMS = {
    spelling
    for camel in (
        "contents",
        "systemInstruction",
        "tools",
        "toolConfig",
        "generationConfig",
        "model",
    )
    for spelling in (camel, snake_case(camel))
}
# FunctionCallingConfig.Mode by name, and by number for Vertex's enum-encoding=int.
_MODES: dict[str | int, str] = {
    "AUTO": "auto",
    "ANY": "required",
    "NONE": "none",
    1: "auto",
    2: "required",
    3: "none",
}


def normalize(exchange: Exchange) -> Normalized:
    notes = Notes()
    body = obj(exchange.request, "request")
    request = _request(body, exchange, notes)
    return Normalized(assemble(exchange, "gemini", request, reply(exchange, notes)), notes.dropped)


def _request(body: JsonObject, exchange: Exchange, notes: Notes) -> Request:
    model = exchange.model_from_path or opt_text(body.get("model"), "model")
    return Request(
        prompt=_system(body, notes) + _contents(body, notes),
        tools=_tools(body, notes),
        params=_params(body, exchange, notes),
        model=model.removeprefix("models/") if model else None,
    )


def _contents(body: JsonObject, notes: Notes) -> list[Message]:
    path, contents = pick(body, "", "contents")
    items = one_or_many(contents, path) if contents is not None else []
    if not items:
        raise NormalizeError(path, "must hold at least one content")
    messages: list[Message] = []
    for where, content in items:
        content = obj(content, where)
        role = content.get("role", "user")
        if not isinstance(role, str) or role not in _ROLES:
            raise NormalizeError(
                at(where, "role"), f"invalid role {role!r} (Gemini takes user or model)"
            )
        messages += content_messages(where, content, _ROLES[role], notes)
    return messages


def _system(body: JsonObject, notes: Notes) -> list[Message]:
    path, system = pick(body, "", "systemInstruction")
    if system is None or system == "":
        return []
    if isinstance(system, str):  # what the SDKs accept; REST wants a Content
        return [Message(role="system", content=[TextPart(text=system)])]
    (message,) = content_messages(path, obj(system, path), "system", notes)
    return [message] if message.content else []


def _tools(body: JsonObject, notes: Notes) -> list[ToolDef]:
    path, tools = pick(body, "", "tools")
    defs: list[ToolDef] = []
    for where, tool in one_or_many(tools, path) if tools is not None else []:
        tool = obj(tool, where)
        for key, value in tool.items():
            if snake_case(key) != "function_declarations":
                # googleSearch, codeExecution, urlContext...: run by Google, no schema here.
                notes.drop(at(where, key), f"built-in tool {key!r} is not carried")
                continue
            for decl_path, decl in one_or_many(value, at(where, key)):
                defs.append(_function(decl_path, obj(decl, decl_path), notes))
    return defs


def _function(path: str, decl: JsonObject, notes: Notes) -> ToolDef:
    schema_path, schema = pick(decl, path, "parametersJsonSchema")
    parameters: JsonObject | None
    if schema is not None:  # already JSON Schema
        parameters = obj(schema, schema_path)
    else:
        schema_path, schema = pick(decl, path, "parameters")
        parameters = None if schema is None else json_schema(schema, schema_path, notes)
    response_path, response = pick(decl, path, "response")
    if response is not None:
        notes.drop(response_path, "the function's response schema is not carried")
    return build(
        ToolDef,
        path,
        name=name(decl.get("name"), at(path, "name")),
        description=opt_text(decl.get("description"), at(path, "description")),
        parameters=parameters,
    )


def _params(body: JsonObject, exchange: Exchange, notes: Notes) -> RequestParams:
    config_path, config = pick(body, "", "generationConfig")
    config = opt_obj(config, config_path) or {}
    mapped: dict[str, tuple[str, Any]] = {}
    extras: JsonObject = {}
    for key, value in config.items():
        camel = next((c for c in _GENERATION if key in (c, snake_case(c))), None)
        if camel is not None and value is not None:
            mapped[_GENERATION[camel]] = (at(config_path, key), value)
        elif camel is None:
            extras[snake_case(key)] = value
    if (choice := _tool_choice(body)) is not None:
        mapped["tool_choice"] = choice
    if exchange.stream is not None:
        mapped["stream"] = ("stream", True)
    extras |= {snake_case(k): v for k, v in body.items() if k not in _NOT_PARAMS}
    if body.get("cachedContent") or body.get("cached_content"):
        notes.drop("cachedContent", "the cached prompt's contents are not in the request")
    return request_params(mapped, extras)


def _tool_choice(body: JsonObject) -> tuple[str, Any] | None:
    """toolConfig.functionCallingConfig in OpenAI's words where they mean the same."""
    path, config = pick(body, "", "toolConfig")
    calling_path, calling = pick(opt_obj(config, path) or {}, path, "functionCallingConfig")
    calling = opt_obj(calling, calling_path)
    if calling is None:
        return None
    mode = calling.get("mode")
    names_path, names = pick(calling, calling_path, "allowedFunctionNames")
    names = arr(names, names_path) if names is not None else []
    mode = mode.upper() if isinstance(mode, str) else mode
    meaning = (
        _MODES.get(mode) if isinstance(mode, str | int) and not isinstance(mode, bool) else None
    )
    if meaning == "required" and len(names) == 1 and isinstance(names[0], str):
        return (calling_path, {"type": "function", "function": {"name": names[0]}})
    if meaning is not None and not names:
        return (at(calling_path, "mode"), meaning)
    return (calling_path, calling)

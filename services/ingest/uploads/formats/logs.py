"""Request/response log records -> an `Exchange` for the provider normalisers.

A log line holds one call as some tool recorded it. Accepted record shapes:

* `{"request": <body>, "response": <body>}`: the plain shape (our own export, most proxies).
  OpenAI bodies may be Chat Completions or Responses (a request with `input`, a `response`
  object, or a URI ending in /v1/responses).
* `{"req": <body>, "resp": <body>}`: OpenPipe's request logs.
* HTTP records, either side: `{"method"?, "uri"|"url"?, "body": <body>}` for the request and
  `{"status"?, "body": <body>}` for the response (vcrpy cassettes, Helicone-like exports). The
  URI names the provider and, for Gemini, the model (`.../models/<model>:generateContent`).
* LiteLLM's StandardLoggingPayload: `{"model", "messages", "model_parameters"?, "response",
  "status": "success"|"failure", "error_str"?}`. LiteLLM answers in OpenAI's shape for every
  provider, so these are `openai_log`.

The response is the JSON body, the raw SSE text of a stream (a string), or the stream's events as
an array of objects. The HTTP status comes from `status` / `status_code` / `statusCode` (an
integer) or the response record; 200 when absent. A top-level `model` names the model when the
body does not (Gemini bodies never do).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

import orjson

from services.ingest.normalize import (
    RESPONSES_PATH,
    Exchange,
    Normalized,
    NormalizeError,
    normalize,
)
from services.ingest.uploads.formats._common import JsonObject, at, join, kind, obj, opt_text
from shared.chat import MetadataValue

LogProvider = Literal["openai", "anthropic", "gemini"]

# Keys a record may use for its parts, beyond the request and response themselves.
_STATUS_KEYS = ("status", "status_code", "statusCode")
_RECORD_KEYS = {"request", "response", "req", "resp", "model", *_STATUS_KEYS}
_LITELLM_KEYS = {"messages", "model_parameters", "response", "model", "status", "error_str"}
# Response-body keys of the three providers: a response record holding one of them is a body.
_BODY_KEYS = {"choices", "content", "candidates", "type", "error", "id", "object"}
_GEMINI_MODEL = re.compile(r"models/([^/:?]+):(?:stream)?[gG]enerateContent")


@dataclass
class LogRecord:
    """The parts of a log line, and where in the line each one sits (for error paths)."""

    request: JsonObject
    request_path: str
    response: JsonObject | str | None
    response_path: str
    status: int = 200
    uri: str | None = None
    model: str | None = None
    known_keys: set[str] = field(default_factory=set)


def is_log(record: JsonObject) -> bool:
    """Whether the line is a request/response record (the keys that decide: request+response,
    req+resp, or LiteLLM's messages+response)."""
    return (
        ("request" in record and "response" in record)
        or ("req" in record and "resp" in record)
        or ("messages" in record and "response" in record)
    )


def read_record(record: JsonObject) -> LogRecord:
    """Find the request, response, status and model of a log line, whatever its shape."""
    if "request" in record or "req" in record:
        request_key, response_key = (
            ("request", "response") if "request" in record else ("req", "resp")
        )
        log = _read_pair(record, request_key, response_key)
    elif "messages" in record:
        log = _read_litellm(record)
    else:
        raise NormalizeError("", "a log record needs request and response (or req and resp)")
    if (model := record.get("model")) is not None and log.model is None:
        log.model = opt_text(model, "model")
    return log


def _read_pair(record: JsonObject, request_key: str, response_key: str) -> LogRecord:
    request = obj(record.get(request_key), request_key)
    request_path, uri = request_key, None
    if isinstance(request.get("body"), dict) and not _is_request_body(request):
        uri = _uri(request, request_key)
        request, request_path = request["body"], at(request_key, "body")
    response, response_path, status = record.get(response_key), response_key, None
    if isinstance(response, dict) and "body" in response and not _BODY_KEYS & response.keys():
        status = _status(response.get("status"), at(response_key, "status"))
        response, response_path = response["body"], at(response_key, "body")
    for key in _STATUS_KEYS:
        if status is None and key in record:
            status = _status(record[key], key)
    return LogRecord(
        request=request,
        request_path=request_path,
        response=_response(response, response_path),
        response_path=response_path,
        status=200 if status is None else status,
        uri=uri,
        model=_model_from_uri(uri),
        known_keys=_RECORD_KEYS,
    )


def _read_litellm(record: JsonObject) -> LogRecord:
    params = record.get("model_parameters") or {}
    request = {**obj(params, "model_parameters"), "messages": record["messages"]}
    if isinstance(record.get("model"), str):
        request["model"] = record["model"]
    response = record.get("response")
    status = 200
    if record.get("status") == "failure":
        # LiteLLM logs a failed call with its error text only, no provider body or status.
        error = record.get("error_str")
        status, response = 500, {"error": {"message": error if isinstance(error, str) else ""}}
    return LogRecord(
        request=request,
        request_path="",
        response=_response(response, "response"),
        response_path="response",
        status=status,
        known_keys=_LITELLM_KEYS,
    )


def _is_request_body(request: JsonObject) -> bool:
    return any(key in request for key in ("messages", "contents", "input"))


def _uri(request: JsonObject, path: str) -> str | None:
    for key in ("uri", "url"):
        if key in request:
            return opt_text(request[key], at(path, key))
    return None


def _model_from_uri(uri: str | None) -> str | None:
    match = _GEMINI_MODEL.search(uri) if uri else None
    return match.group(1) if match else None


def _status(value: Any, path: str) -> int | None:
    if isinstance(value, dict):  # vcrpy's own `{"code": 200, "message": "OK"}`
        value, path = value.get("code"), at(path, "code")
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 100 <= value <= 599:
        raise NormalizeError(path, f"must be an HTTP status code (100-599), not {kind(value)}")
    return value


def _response(value: Any, path: str) -> JsonObject | str | None:
    """The body, the SSE text, or a list of stream events turned into SSE text."""
    if value is None or isinstance(value, dict | str):
        return value
    if isinstance(value, list):
        events = [obj(event, at(path, i)) for i, event in enumerate(value)]
        return "".join(f"data: {orjson.dumps(event).decode()}\n\n" for event in events)
    raise NormalizeError(path, f"must be an object, a string or an array, not {kind(value)}")


# --- which provider -----------------------------------------------------------------------------


def provider_signals(log: LogRecord) -> dict[LogProvider, str]:
    """Each provider the record looks like, with the evidence, from the URI, the request body
    and the response body. More than one means the record contradicts itself."""
    signals: dict[LogProvider, str] = {}
    for provider, evidence in (_by_uri(log.uri), _by_request(log), _by_response(log)):
        if provider is not None:
            signals.setdefault(provider, evidence)
    return signals


def detect_provider(log: LogRecord) -> tuple[LogProvider, str]:
    """The provider whose wire format the record holds, with the evidence."""
    signals = provider_signals(log)
    if len(signals) > 1:
        said = " but ".join(f"{evidence} ({p})" for p, evidence in signals.items())
        raise NormalizeError("", f"cannot tell the provider: {said}")
    if signals:
        ((provider, evidence),) = signals.items()
        return provider, evidence
    if "messages" in log.request:
        # No response shape to go by (an OpenAI-style `{"error": ...}` or none at all).
        return "openai", "the request has messages and nothing says Anthropic or Gemini"
    if "input" in log.request:
        return "openai", "the request has input (OpenAI Responses)"
    raise NormalizeError(
        log.request_path,
        "cannot tell the provider: expected messages (OpenAI, Anthropic), input (OpenAI "
        "Responses) or contents (Gemini)",
    )


_Signal = tuple[LogProvider | None, str]
# Path pieces of each provider's endpoint (generateContent also matches the streaming one).
_ENDPOINTS: tuple[tuple[str, LogProvider], ...] = (
    ("chat/completions", "openai"),
    (RESPONSES_PATH, "openai"),
    ("/messages", "anthropic"),
    ("generateContent", "gemini"),
)


def _by_uri(uri: str | None) -> _Signal:
    if not uri:
        return None, ""
    for needle, provider in _ENDPOINTS:
        if needle in uri:
            return provider, f"the URI has {needle}"
    return None, ""


def _by_request(log: LogRecord) -> _Signal:
    request = log.request
    if "contents" in request:
        return "gemini", "the request has contents"
    for key in ("system", "anthropic_version", "stop_sequences"):
        if key in request:
            return "anthropic", f"the request has {key}"
    return None, ""


def _by_response(log: LogRecord) -> _Signal:
    response = log.response
    if isinstance(response, str):
        return _by_stream(response)
    if not isinstance(response, dict):
        return None, ""
    if any(key in response for key in ("candidates", "promptFeedback", "usageMetadata")):
        return "gemini", "the response has candidates"
    if response.get("type") in ("message", "error"):
        return "anthropic", f"the response has type {response['type']!r}"
    if "choices" in response or str(response.get("object", "")).startswith("chat.completion"):
        return "openai", "the response has choices"
    if response.get("object") == "response":
        return "openai", "the response is a Responses object"
    return None, ""


def _by_stream(stream: str) -> _Signal:
    if "message_start" in stream:
        return "anthropic", "the stream has message_start"
    if '"candidates"' in stream:
        return "gemini", "the stream has candidates"
    if "chat.completion.chunk" in stream or '"choices"' in stream:
        return "openai", "the stream has choices"
    if '"response.completed"' in stream or '"response.created"' in stream:
        return "openai", "the stream has Responses events"
    return None, ""


# --- to samples ---------------------------------------------------------------------------------


def to_exchange(
    log: LogRecord,
    provider: LogProvider,
    *,
    tenant: str,
    source_ref: str,
    created_at: datetime,
    metadata: dict[str, MetadataValue],
) -> Exchange:
    """The call as the normalisers take it. A top-level `model` fills in a body without one;
    for Gemini it is the model the URL would have named."""
    request = log.request
    if provider != "gemini" and log.model is not None and "model" not in request:
        request = {**request, "model": log.model}
    response, stream = (
        (None, log.response) if isinstance(log.response, str) else (log.response, None)
    )
    return Exchange(
        provider=provider,
        request=request,
        status=log.status,
        response=response,
        stream=stream,
        model_from_path=log.model if provider == "gemini" else None,
        api_path=RESPONSES_PATH if provider == "openai" and _is_responses(log) else None,
        tenant=tenant,
        source="upload",
        source_ref=source_ref,
        created_at=created_at,
        metadata=dict(metadata),
    )


def _is_responses(log: LogRecord) -> bool:
    """An OpenAI record of the Responses API rather than Chat Completions: its URI, a request
    with `input` and no `messages`, or a Responses object for an answer."""
    if log.uri is not None and RESPONSES_PATH in log.uri:
        return True
    if "input" in log.request and "messages" not in log.request:
        return True
    return isinstance(log.response, dict) and log.response.get("object") == "response"


def normalize_log(log: LogRecord, exchange: Exchange) -> Normalized:
    """The provider normaliser's samples, with its error paths rewritten to point into the line
    (`messages[2]` of the request becomes `request.messages[2]`)."""
    try:
        return normalize(exchange)
    except NormalizeError as exc:
        raise NormalizeError(line_path(exc.path, log), exc.reason) from None


def line_path(path: str, log: LogRecord) -> str:
    """A normaliser path (relative to the request body, or under `response` / `stream` /
    `request`) as a path into the log line."""
    match = re.match(r"[A-Za-z_]+", path)
    head = match.group(0) if match else ""
    if head == "response" or (head == "stream" and isinstance(log.response, str)):
        return join(log.response_path, path[len(head) :])
    if head == "request":
        return join(log.request_path, path[len(head) :])
    return join(log.request_path, path)

"""What the three provider normalisers share: the fidelity notes, safe construction of canonical
models, request parameters, provider error summaries, and the final step that turns a parsed
request and reply into one sample per choice."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from services.ingest.normalize import Dropped, Exchange, NormalizeError
from services.ingest.normalize._json import JsonObject, at, loads
from shared.chat import (
    FinishReason,
    Message,
    Provider,
    ProviderError,
    RequestParams,
    ResponseMeta,
    Sample,
    ToolDef,
    Usage,
    error_path,
    normalize_finish_reason,
)
from shared.redact import redact_mapping, redact_text

Model = TypeVar("Model", bound=BaseModel)

# An error message longer than this is cut: it is a summary, not a log.
_MAX_ERROR_MESSAGE = 2000


class Notes:
    """The fidelity report of one exchange: what the samples do not carry, and why."""

    def __init__(self) -> None:
        self.dropped: list[Dropped] = []

    def drop(self, path: str, reason: str) -> None:
        self.dropped.append(Dropped(path, reason))

    def unknown_keys(self, raw: Mapping[str, Any], known: Iterable[str], path: str) -> None:
        """Note every field outside `known` that holds something (null, [] and {} say nothing)."""
        known = set(known)
        for key, value in raw.items():
            if key not in known and value not in (None, [], {}, ""):
                self.drop(at(path, key), f"{key!r} is not carried")


def join(path: str, rest: str) -> str:
    """`path` followed by a relative path (`name` or `[0].name`)."""
    if not rest or not path:
        return path or rest
    return path + rest if rest.startswith("[") else f"{path}.{rest}"


def build(cls: type[Model], path: str, /, **fields: Any) -> Model:
    """`cls(**fields)`, with a validation failure reported as a NormalizeError under `path`."""
    try:
        return cls(**fields)
    except ValidationError as exc:
        error = exc.errors()[0]
        raise NormalizeError(join(path, error_path(tuple(error["loc"]))), error["msg"]) from None


@dataclass
class Request:
    """A provider request in canonical terms."""

    prompt: list[Message]
    tools: list[ToolDef] = field(default_factory=list)
    params: RequestParams = field(default_factory=RequestParams)
    model: str | None = None


@dataclass
class Answer:
    """One choice (OpenAI) or candidate (Gemini) of a reply; `message` None when it is empty."""

    index: int
    message: Message | None
    finish_raw: str | int | None = None


@dataclass
class Reply:
    """What the upstream answered: answers, or an error summary."""

    answers: list[Answer] = field(default_factory=list)
    model: str | None = None
    response_id: str | None = None
    usage: Usage | None = None
    error: ProviderError | None = None
    # A prompt the provider refused to answer (Gemini blockReason) is content_filter, not error.
    error_finish: FinishReason = "error"
    error_finish_raw: str | int | None = None


def request_params(mapped: dict[str, tuple[str, Any]], extras: JsonObject) -> RequestParams:
    """RequestParams from `mapped` (canonical name -> (request path, value)) and provider-specific
    `extras`, which are kept as they are but for secrets (e.g. an MCP server's token)."""
    values = {name: value for name, (_, value) in mapped.items() if value is not None}
    try:
        return RequestParams.model_validate({**redact_mapping(extras), **values})
    except ValidationError as exc:
        error = exc.errors()[0]
        loc = tuple(error["loc"])
        head = str(loc[0]) if loc else ""
        path = mapped[head][0] if head in mapped else head
        rest = error_path(loc[1:])
        raise NormalizeError(join(path, rest), error["msg"]) from None


def response_source(exchange: Exchange) -> JsonObject | str:
    """The response body (parsed JSON) or the raw text of a stream."""
    if exchange.stream is not None and exchange.response is not None:
        raise NormalizeError("response", "give the response body or the stream text, not both")
    if exchange.stream is not None:
        if not isinstance(exchange.stream, str):
            raise NormalizeError("stream", "must be the raw text of the event stream")
        return exchange.stream
    if exchange.response is None:
        raise NormalizeError("response", "the exchange has no response body or stream")
    if not isinstance(exchange.response, dict):
        raise NormalizeError("response", "must be a JSON object")
    return exchange.response


def error_reply(exchange: Exchange, body: Any = None) -> Reply:
    """The error summary of a failed call; the three providers all nest it under `error`
    (OpenAI: type + code, Anthropic: type, Gemini: status)."""
    if body is None:
        body = exchange.response if exchange.response is not None else exchange.stream
    if isinstance(body, str):
        try:
            body = loads(body, "response")
        except NormalizeError:
            body = {"error": {"message": body}}
    if isinstance(body, list) and body:  # Gemini's JSON-array stream
        body = body[0]
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        # A bare string, or a body that was not JSON (a proxy's HTML page), which the capture
        # step hands over as {"raw": text}.
        raw = body.get("raw") if isinstance(body, dict) else None
        error = {"message": error if isinstance(error, str) else raw}
    kind = error.get("type") if isinstance(error.get("type"), str) else error.get("status")
    code = error.get("code")
    message = error.get("message")
    summary = ProviderError(
        status_code=exchange.status if exchange.status >= 400 else None,
        type=kind if isinstance(kind, str) else None,
        code=code if isinstance(code, str) else None,
        message=redact_text(message[:_MAX_ERROR_MESSAGE]) if isinstance(message, str) else "",
    )
    return Reply(error=summary)


def check_unique_indices(answers: list[Answer], path: str) -> None:
    """Choice indices become part of the sample ids, so two equal ones would collide."""
    seen: set[int] = set()
    for position, answer in enumerate(answers):
        if answer.index in seen:
            raise NormalizeError(at(at(path, position), "index"), f"duplicate index {answer.index}")
        seen.add(answer.index)


def assemble(
    exchange: Exchange, provider: Provider, request: Request, reply: Reply
) -> list[Sample]:
    """One sample per answer (the prompt plus that answer), or one prompt-only sample for an error."""
    common: dict[str, Any] = {
        "provider": provider,
        "model_requested": request.model,
        "model": reply.model,
        "response_id": reply.response_id,
        "usage": reply.usage,
        "latency_ms": exchange.latency_ms,
        "time_to_first_token_ms": exchange.time_to_first_token_ms,
    }
    if reply.error is not None:
        meta = build(
            ResponseMeta,
            "response",
            **common,
            status="error",
            error=reply.error,
            finish_reason=reply.error_finish,
            finish_reason_raw=reply.error_finish_raw,
        )
        return [_sample(exchange, request, None, meta)]
    samples = []
    for answer in reply.answers:
        message = answer.message if answer.message and _says_something(answer.message) else None
        has_calls = message is not None and bool(message.tool_calls)
        meta = build(
            ResponseMeta,
            "response",
            **common,
            choice_index=answer.index,
            finish_reason=normalize_finish_reason(answer.finish_raw, has_tool_calls=has_calls),
            finish_reason_raw=answer.finish_raw,
        )
        samples.append(_sample(exchange, request, message, meta))
    return samples


def _says_something(message: Message) -> bool:
    return bool(message.content or message.tool_calls or message.reasoning or message.refusal)


def _sample(
    exchange: Exchange, request: Request, answer: Message | None, meta: ResponseMeta
) -> Sample:
    messages = [*request.prompt, answer] if answer is not None else list(request.prompt)
    return build(
        Sample,
        "",
        tenant=exchange.tenant,
        source=exchange.source,
        source_ref=exchange.source_ref,
        created_at=exchange.created_at or datetime.now(UTC),
        messages=messages,
        tools=request.tools,
        params=request.params,
        response=meta,
        tags=list(exchange.tags),
        metadata=dict(exchange.metadata),
    )

"""A conversation assembled from a trace -> canonical samples: messages plus the last model
call's tools, request parameters, response metadata (provider, models, usage, finish reason,
latency, error status) and a little provenance metadata (span name, service, custom
attributes). One sample per choice of the last call.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

from services.ingest.otlp import genai_meta
from services.ingest.otlp.export import STATUS_ERROR, Span
from services.ingest.otlp.genai_calls import ChatCall, call_tools
from services.ingest.otlp.genai_conventions import details_attributes
from services.ingest.otlp.genai_parts import ContentError, Msg, Notes
from shared.chat import Sample, normalize_finish_reason
from shared.redact import is_secret_name, redact_text

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_KNOWN_PREFIXES = (
    "gen_ai.",
    "llm.",
    "input.",
    "output.",
    "openinference.",
    "traceloop.",
    "pydantic_ai.",
    "logfire.",
    "telemetry.",
    "http.",
    "url.",
    "server.",
    "net.",
    "error.",
    "tool.",
)
# Unprefixed keys that hold content or values already mapped (am01's input/output, pydantic-ai).
_SKIPPED_KEYS = frozenset({"input", "output", "final_result", "model_name", "agent_name"})
_METADATA_KEYS = ("gen_ai.agent.name", "gen_ai.conversation.id", "gen_ai.operation.name")
_MAX_CUSTOM_ATTRS, _MAX_CUSTOM_LEN = 32, 256


def conversation_ref(trace_id: str, messages: list[Msg]) -> str:
    """`<trace id>/<hash of the conversation's opening>` (the messages up to its first user turn).

    A trace may reach us in several exports (a simple span processor sends each span alone), and
    every model call of a conversation resends its opening: so each partial sample of one
    conversation gets the same id, and the store keeps the longest (services.ingest.samples.store).
    """
    opening: list[Msg] = []
    for message in messages:
        opening.append(message)
        if message.get("role") == "user":
            break
    digest = hashlib.sha256(
        orjson.dumps(opening, option=orjson.OPT_SORT_KEYS, default=str)
    ).hexdigest()
    return f"{trace_id}/{digest[:16]}"


def build_samples(
    last: ChatCall,
    messages: list[Msg],
    calls: list[ChatCall],
    tool_runs: int,
    tenant: str,
    notes: Notes,
) -> list[Sample]:
    """A conversation's samples: `messages` end with `last`'s first choice (when it has one);
    each further choice of `last` gives one more sample. Raises ContentError (unreadable tool
    definitions) or pydantic's ValidationError."""
    span = last.span
    attrs = {**details_attributes(span), **span.attributes}
    base = messages[:-1] if last.outputs else messages
    choices: list[tuple[Msg | None, str | None]] = list(last.outputs) or [(None, None)]
    reasons = genai_meta.finish_reasons(attrs)
    provider = genai_meta.provider(attrs)
    common = {
        "tenant": tenant,
        "source": "otlp",
        "source_ref": conversation_ref(span.trace_id, messages),
        "created_at": _EPOCH + timedelta(microseconds=span.start_ns // 1000),
        "tools": _tools(last, calls, notes),
        "params": genai_meta.request_params(attrs),
        "metadata": _metadata(last, len(calls), tool_runs, attrs, provider[1]),
    }
    samples = []
    for index, (answer, finish) in enumerate(choices):
        raw = finish or (reasons[index] if index < len(reasons) else None)
        sent = [*base, answer] if answer is not None else base
        response = _response(span, attrs, provider[0], index, raw, answer)
        samples.append(Sample.model_validate({**common, "messages": sent, "response": response}))
    return samples


def _response(
    span: Span,
    attrs: dict[str, Any],
    provider: str,
    index: int,
    raw: str | None,
    answer: Msg | None,
) -> dict[str, Any]:
    response: dict[str, Any] = {
        "provider": provider,
        "model_requested": genai_meta.requested_model(attrs),
        "model": genai_meta.response_model(attrs),
        "response_id": attrs.get("gen_ai.response.id")
        if isinstance(attrs.get("gen_ai.response.id"), str)
        else None,
        "choice_index": index,
        "finish_reason_raw": raw,
        "usage": genai_meta.usage(attrs),
    }
    if span.end_ns >= span.start_ns > 0:
        response["latency_ms"] = (span.end_ns - span.start_ns) / 1e6
    if span.status.code == STATUS_ERROR:
        error_type = attrs.get("error.type")
        response["status"] = "error"
        response["error"] = {
            "message": span.status.message or "span status ERROR",
            "type": error_type if isinstance(error_type, str) else None,
        }
    else:
        has_calls = bool(answer and answer.get("tool_calls"))
        response["finish_reason"] = normalize_finish_reason(raw, has_tool_calls=has_calls)
    return response


def _tools(last: ChatCall, calls: list[ChatCall], notes: Notes) -> list[dict[str, Any]]:
    """The last call's tool definitions, else the latest earlier call's; first name wins.
    Unreadable definitions reject the sample only when they are the last call's own."""
    for call in [last, *(c for c in reversed(calls) if c is not last)]:
        try:
            tools = call_tools(call, notes)
        except ContentError as exc:
            if call is last:
                raise
            notes.append((f"(span {call.span.span_id}) {exc.path}", f"{exc.reason}; not used"))
            continue
        if tools:
            unique: dict[str, dict[str, Any]] = {}
            for tool in tools:
                unique.setdefault(tool["name"], tool)
            return list(unique.values())
    return []


def _metadata(
    last: ChatCall,
    model_calls: int,
    tool_runs: int,
    attrs: dict[str, Any],
    raw_provider: str | None,
) -> dict[str, Any]:
    span = last.span
    metadata: dict[str, Any] = {
        "otlp.span_name": span.name,
        "otlp.dialect": last.dialect,
        "otlp.model_calls": model_calls,
        "otlp.tool_runs": tool_runs,
    }
    service = span.resource.get("service.name")
    for key, value in (
        ("service.name", service),
        ("otlp.scope", span.scope_name),
        ("otlp.provider", raw_provider),
    ):
        if isinstance(value, str) and value:
            metadata[key] = value
    for key in _METADATA_KEYS:
        if isinstance(attrs.get(key), str | int):
            metadata[key] = attrs[key]
    metadata.update(_custom_attributes(span.attributes))
    return metadata


def _custom_attributes(attrs: dict[str, Any]) -> dict[str, Any]:
    """The span's own attributes outside known instrumentation namespaces (lf05/lf06 keep
    them), scalar and short, secrets by name skipped and secret-looking values redacted."""
    custom: dict[str, Any] = {}
    for key, value in attrs.items():
        if len(custom) >= _MAX_CUSTOM_ATTRS:
            break
        if key.startswith(_KNOWN_PREFIXES) or key in _SKIPPED_KEYS or is_secret_name(key):
            continue
        if isinstance(value, str) and len(value) <= _MAX_CUSTOM_LEN:
            custom[f"attr.{key}"] = redact_text(value)
        elif isinstance(value, bool | int | float):
            custom[f"attr.{key}"] = value
    return custom

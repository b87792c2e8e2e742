"""Realistic agent traces for the ingest benchmark, as OTLP/HTTP export request bodies.

Each trace is what an instrumented support agent exports for one user question (current GenAI
semantic conventions, JSON-string message attributes): the server span of the app's HTTP
endpoint, three `chat` spans whose `gen_ai.input.messages` carry the growing history, each with
the HTTP client span of its provider call, and two `execute_tool` spans between them. Nine spans,
one conversation, one sample. Texts, ids and numbers vary per trace.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import orjson
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

SPANS_PER_TRACE = 9
SERVER, CLIENT, INTERNAL = 2, 3, 1
_SCOPES = {
    "http": ("opentelemetry.instrumentation.httpx", "0.55b0"),
    "genai": ("opentelemetry.instrumentation.openai_v2", "2.1b0"),
    "agent": ("support-agent", "1.4.2"),
}
RESOURCE = {
    "service.name": "support-agent",
    "service.version": "1.4.2",
    "deployment.environment.name": "production",
    "telemetry.sdk.name": "opentelemetry",
    "telemetry.sdk.language": "python",
    "telemetry.sdk.version": "1.45.2",
}
SYSTEM = (
    "You are the support assistant of an online shop. Be brief and friendly. Use the tools to "
    "look orders up before answering; never invent order numbers, prices or delivery dates. "
    "If a refund is requested, check the order status first and explain the next step."
)
TOOLS = [
    {
        "type": "function",
        "name": "get_order",
        "description": "Look an order up by its number.",
        "parameters": {
            "type": "object",
            "properties": {"order_id": {"type": "string"}},
            "required": ["order_id"],
        },
    },
    {
        "type": "function",
        "name": "track_parcel",
        "description": "Where a parcel is now, by tracking number.",
        "parameters": {
            "type": "object",
            "properties": {"tracking_id": {"type": "string"}},
            "required": ["tracking_id"],
        },
    },
]
_ITEMS = ["hiking boots", "espresso machine", "desk lamp", "rain jacket", "headphones", "kettle"]
_CITIES = ["Lyon", "Porto", "Leipzig", "Gdansk", "Bologna", "Ghent", "Malmo", "Brno"]


@dataclass
class SpanData:
    scope: str
    trace_id: str
    span_id: str
    parent: str | None
    name: str
    kind: int
    start: int
    end: int
    attributes: dict[str, Any] = field(default_factory=dict)


def _text(role: str, content: str) -> dict[str, Any]:
    return {"role": role, "parts": [{"type": "text", "content": content}]}


def _call(call_id: str, name: str, **arguments: str) -> dict[str, Any]:
    part = {"type": "tool_call", "id": call_id, "name": name, "arguments": arguments}
    return {"role": "assistant", "parts": [part], "finish_reason": "tool_call"}


def _result(call_id: str, response: str) -> dict[str, Any]:
    part = {"type": "tool_call_response", "id": call_id, "response": response}
    return {"role": "tool", "parts": [part]}


def _json(value: Any) -> str:
    return orjson.dumps(value).decode()


class TraceFactory:
    """Makes traces with random ids from a seeded generator, so runs are comparable."""

    def __init__(self, seed: int = 7) -> None:
        self.rng = random.Random(seed)
        self.clock = 1_760_000_000_000_000_000

    def _id(self, nbytes: int) -> str:
        return self.rng.randbytes(nbytes).hex()

    def trace(self) -> list[SpanData]:
        rng, trace_id = self.rng, self._id(16)
        order, parcel = f"A{rng.randint(100000, 999999)}", f"TRK{rng.randint(10**8, 10**9)}"
        item, city = rng.choice(_ITEMS), rng.choice(_CITIES)
        question = _text(
            "user",
            f"Hi, I ordered the {item} ({order}) {rng.randint(2, 12)} days ago and it has not "
            f"arrived in {city} yet. Where is it, and can I still cancel?",
        )
        order_json = _json(
            {"order_id": order, "item": item, "status": "shipped", "total_eur": rng.randint(19, 400),
             "tracking_id": parcel, "city": city})  # fmt: skip
        track_json = _json(
            {"tracking_id": parcel, "location": f"{city} depot", "eta_days": rng.randint(1, 4),
             "events": [{"at": "2025-10-08T09:12:00Z", "what": "arrived at depot"}]})  # fmt: skip
        answer = (
            f"Your {item} is at the {city} depot and should reach you within a few days. It has "
            "already shipped, so it cannot be cancelled any more, but you can return it for free."
        )
        history: list[dict[str, Any]] = [question]
        turns = [
            (_call("call_" + self._id(6), "get_order", order_id=order), order_json),
            (_call("call_" + self._id(6), "track_parcel", tracking_id=parcel), track_json),
            (_text("assistant", answer) | {"finish_reason": "stop"}, None),
        ]
        root_id, start = self._id(8), self.clock
        self.clock += 5_000_000_000
        spans = []
        at = start + 2_000_000
        for output, tool_result in turns:
            chat_id = self._id(8)
            spans.append(self._chat(trace_id, chat_id, root_id, at, list(history), output))
            spans.append(self._http(trace_id, chat_id, at + 1_000_000, at + 799_000_000))
            history.append(output)
            at += 800_000_000
            if tool_result is not None:
                part = output["parts"][0]
                spans.append(self._tool(trace_id, root_id, at, part, tool_result))
                history.append(_result(part["id"], tool_result))
                at += 50_000_000
        server = SpanData("http", trace_id, root_id, None, "POST /support/chat", SERVER, start,
                          at + 1_000_000, {"http.request.method": "POST", "http.route": "/support/chat",
                          "http.response.status_code": 200, "url.scheme": "https",
                          "server.address": "shop.example"})  # fmt: skip
        return [server, *spans]

    def _chat(self, trace_id: str, span_id: str, parent: str, at: int,
              history: list[dict[str, Any]], output: dict[str, Any]) -> SpanData:  # fmt: skip
        tokens_in = 180 + 40 * len(history)
        attributes = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": "openai",
            "gen_ai.request.model": "gpt-4o-mini",
            "gen_ai.response.model": "gpt-4o-mini-2024-07-18",
            "gen_ai.response.id": "chatcmpl-" + self._id(12),
            "gen_ai.request.temperature": 0.2,
            "gen_ai.response.finish_reasons": [output["finish_reason"]],
            "gen_ai.usage.input_tokens": tokens_in,
            "gen_ai.usage.output_tokens": self.rng.randint(12, 90),
            "gen_ai.system_instructions": _json([{"type": "text", "content": SYSTEM}]),
            "gen_ai.tool.definitions": _json(TOOLS),
            "gen_ai.input.messages": _json(history),
            "gen_ai.output.messages": _json([output]),
            "server.address": "api.openai.com",
        }
        return SpanData("genai", trace_id, span_id, parent, "chat gpt-4o-mini", CLIENT, at,
                        at + 800_000_000, attributes)  # fmt: skip

    def _http(self, trace_id: str, parent: str, start: int, end: int) -> SpanData:
        attributes = {
            "http.request.method": "POST",
            "url.full": "https://api.openai.com/v1/chat/completions",
            "server.address": "api.openai.com",
            "http.response.status_code": 200,
        }
        return SpanData(
            "http", trace_id, self._id(8), parent, "POST", CLIENT, start, end, attributes
        )

    def _tool(
        self, trace_id: str, parent: str, at: int, call: dict[str, Any], result: str
    ) -> SpanData:
        attributes = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": call["name"],
            "gen_ai.tool.call.id": call["id"],
            "gen_ai.tool.type": "function",
            "gen_ai.tool.call.arguments": _json(call["arguments"]),
            "gen_ai.tool.call.result": result,
        }
        return SpanData("agent", trace_id, self._id(8), parent, f"execute_tool {call['name']}",
                        INTERNAL, at, at + 40_000_000, attributes)  # fmt: skip


# --- encodings ---------------------------------------------------------------------------------


def _json_value(value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, list):
        return {"arrayValue": {"values": [_json_value(v) for v in value]}}
    return {"stringValue": str(value)}


def _json_attributes(attributes: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"key": k, "value": _json_value(v)} for k, v in attributes.items()]


def to_json(spans: list[SpanData]) -> bytes:
    """One OTLP/JSON ExportTraceServiceRequest (one resource, a scope per instrumentation)."""
    scopes: dict[str, list[dict[str, Any]]] = {name: [] for name in _SCOPES}
    for span in spans:
        encoded = {
            "traceId": span.trace_id,
            "spanId": span.span_id,
            "name": span.name,
            "kind": span.kind,
            "startTimeUnixNano": str(span.start),
            "endTimeUnixNano": str(span.end),
            "attributes": _json_attributes(span.attributes),
            "status": {},
        }
        if span.parent:
            encoded["parentSpanId"] = span.parent
        scopes[span.scope].append(encoded)
    scope_spans = [
        {"scope": {"name": _SCOPES[name][0], "version": _SCOPES[name][1]}, "spans": items}
        for name, items in scopes.items()
        if items
    ]
    resource = {"attributes": _json_attributes(RESOURCE)}
    return orjson.dumps({"resourceSpans": [{"resource": resource, "scopeSpans": scope_spans}]})


def _proto_value(out: AnyValue, value: Any) -> None:
    if isinstance(value, bool):
        out.bool_value = value
    elif isinstance(value, int):
        out.int_value = value
    elif isinstance(value, float):
        out.double_value = value
    elif isinstance(value, list):
        for item in value:
            _proto_value(out.array_value.values.add(), item)
    else:
        out.string_value = str(value)


def to_protobuf(spans: list[SpanData]) -> bytes:
    """The same export as binary protobuf, what the OTel SDKs' OTLP/HTTP exporters send."""
    request = ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    for key, value in RESOURCE.items():
        _proto_value(resource_spans.resource.attributes.add(key=key).value, value)
    by_scope: dict[str, Any] = {}
    for span in spans:
        if span.scope not in by_scope:
            scope_spans = resource_spans.scope_spans.add()
            scope_spans.scope.name, scope_spans.scope.version = _SCOPES[span.scope]
            by_scope[span.scope] = scope_spans
        out = by_scope[span.scope].spans.add(
            trace_id=bytes.fromhex(span.trace_id),
            span_id=bytes.fromhex(span.span_id),
            parent_span_id=bytes.fromhex(span.parent or ""),
            name=span.name,
            kind=span.kind,
            start_time_unix_nano=span.start,
            end_time_unix_nano=span.end,
        )
        for key, value in span.attributes.items():
            _proto_value(out.attributes.add(key=key).value, value)
    return bytes(request.SerializeToString())


def export_bodies(
    factory: TraceFactory, *, requests: int, traces_per_request: int, encoding: str
) -> list[bytes]:
    """`requests` export bodies of whole traces each (a batch span processor's 512-span batch
    holds ~56 of these traces)."""
    encode = to_json if encoding == "json" else to_protobuf
    bodies = []
    for _ in range(requests):
        spans = [span for _ in range(traces_per_request) for span in factory.trace()]
        bodies.append(encode(spans))
    return bodies

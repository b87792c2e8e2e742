"""Binary OTLP (`ExportTraceServiceRequest` protobuf) request bodies -> spans, walking the
parsed message directly rather than through a JSON detour."""

from __future__ import annotations

from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from services.ingest.otlp.spans import (
    BadValue,
    Limits,
    OtlpDecodeError,
    OtlpTooLargeError,
    Span,
    SpanEvent,
    SpanStatus,
    ValueTooLarge,
)

# AnyValue variants read as they are, with no size limit or nesting to check.
_PLAIN_SCALARS = frozenset({"int_value", "bool_value", "double_value"})


def decode_proto_request(raw: bytes, limits: Limits) -> list[Span]:
    """A binary `ExportTraceServiceRequest` -> its spans, in request order."""
    message = ExportTraceServiceRequest()
    try:
        message.ParseFromString(raw)
    except Exception as exc:  # upb raises DecodeError, RecursionError, ...: all mean malformed
        raise OtlpDecodeError("body", f"not a valid ExportTraceServiceRequest ({exc})") from None
    decoder = _ProtoDecoder(limits)
    try:
        decoder.request(message)
    except BadValue as exc:
        raise exc.error() from None
    return decoder.spans


def _bytes_id(raw: bytes, size: int, where: str) -> str:
    if len(raw) != size:
        raise BadValue(where, f"not {size} bytes")
    return raw.hex()


def _parent_id(raw: bytes) -> str | None:
    """None for a root span: the field is empty (or, from some exporters, all zeros)."""
    if not raw.strip(b"\0"):
        return None
    return _bytes_id(raw, 8, ".parentSpanId")


class _ProtoDecoder:
    """Parsed `ExportTraceServiceRequest` -> spans, walking the message directly. Errors travel
    up as `BadValue`, each level adding its path segment, as in `otlp_json`."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.max_value = limits.max_value_bytes
        self.spans: list[Span] = []

    def request(self, message: ExportTraceServiceRequest) -> None:
        for i, rs in enumerate(message.resource_spans):
            try:
                self._resource_spans(rs)
            except BadValue as exc:
                raise exc.under(f"resourceSpans[{i}]") from None

    def _resource_spans(self, rs: Any) -> None:
        try:
            resource = self._attributes(rs.resource.attributes, {})
        except BadValue as exc:
            raise exc.under(".resource.attributes") from None
        for j, ss in enumerate(rs.scope_spans):
            if len(self.spans) + len(ss.spans) > self.limits.max_spans:
                raise OtlpTooLargeError("body", f"more than {self.limits.max_spans} spans")
            scope = ss.scope
            scope_name, scope_version = scope.name or None, scope.version or None
            for k, span in enumerate(ss.spans):
                try:
                    decoded = self._span(span, resource, scope_name, scope_version)
                except BadValue as exc:
                    raise exc.under(f".scopeSpans[{j}].spans[{k}]") from None
                self.spans.append(decoded)

    def _span(
        self, span: Any, resource: dict[str, Any], scope_name: str | None, scope_version: str | None
    ) -> Span:
        oversized: dict[str, int] = {}
        try:
            attributes = self._attributes(span.attributes, oversized)
        except BadValue as exc:
            raise exc.under(".attributes") from None
        events, status = span.events, span.status
        return Span(
            trace_id=_bytes_id(span.trace_id, 16, ".traceId"),
            span_id=_bytes_id(span.span_id, 8, ".spanId"),
            parent_span_id=_parent_id(span.parent_span_id),
            name=span.name,
            kind=span.kind,
            start_ns=span.start_time_unix_nano,
            end_ns=span.end_time_unix_nano,
            attributes=attributes,
            events=self._events(events, oversized) if events else [],  # most spans have none
            status=SpanStatus(status.code, status.message),
            resource=resource,
            scope_name=scope_name,
            scope_version=scope_version,
            oversized=oversized,
        )

    def _events(self, items: Any, oversized: dict[str, int]) -> list[SpanEvent]:
        if len(items) > self.limits.max_events:
            raise BadValue(".events", f"more than {self.limits.max_events} events", too_large=True)
        events = []
        for n, event in enumerate(items):
            dropped: dict[str, int] = {}
            try:
                attrs = self._attributes(event.attributes, dropped)
            except BadValue as exc:
                raise exc.under(f".events[{n}].attributes") from None
            for key, size in dropped.items():
                oversized[f"{event.name}/{key}"] = size
            events.append(SpanEvent(event.name, event.time_unix_nano, attrs))
        return events

    def _attributes(self, items: Any, oversized: dict[str, int]) -> dict[str, Any]:
        if len(items) > self.limits.max_attributes:
            reason = f"more than {self.limits.max_attributes} attributes"
            raise BadValue("", reason, too_large=True)
        attrs: dict[str, Any] = {}
        max_value = self.max_value
        for i, pair in enumerate(items):
            value = pair.value
            # Nearly every attribute is a non-empty string: read first, without asking which
            # variant is set (an unset variant reads as ""), and inline, as a call to `_value`
            # per attribute was a good part of the decode time.
            text = value.string_value
            if text:
                if len(text) > max_value:
                    oversized[pair.key] = len(text)
                else:
                    attrs[pair.key] = text
                continue
            which = value.WhichOneof("value")
            if which == "string_value":
                attrs[pair.key] = text
            elif which in _PLAIN_SCALARS:
                attrs[pair.key] = getattr(value, which)
            else:
                try:
                    attrs[pair.key] = self._value(value, 0)
                except ValueTooLarge as exc:
                    oversized[pair.key] = exc.size
                except BadValue as exc:
                    raise exc.under(f"[{i}].value") from None
        return attrs

    def _value(self, value: AnyValue, depth: int) -> Any:
        which = value.WhichOneof("value")
        if which == "string_value" or which == "bytes_value":
            data = getattr(value, which)
            if len(data) > self.max_value:
                raise ValueTooLarge(len(data))
            return data
        if which == "int_value" or which == "bool_value" or which == "double_value":
            return getattr(value, which)
        if which == "array_value":
            self._check_depth(depth)
            return self._array(value.array_value.values, depth)
        if which == "kvlist_value":
            self._check_depth(depth)
            return self._kvlist(value.kvlist_value.values, depth)
        return None  # unset, or a variant this receiver does not read (string_value_strindex)

    def _array(self, values: Any, depth: int) -> list[Any]:
        result = []
        for i, item in enumerate(values):
            try:
                result.append(self._value(item, depth + 1))
            except BadValue as exc:
                raise exc.under(f".arrayValue.values[{i}]") from None
        return result

    def _kvlist(self, pairs: Any, depth: int) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for i, pair in enumerate(pairs):
            try:
                result[pair.key] = self._value(pair.value, depth + 1)
            except BadValue as exc:
                raise exc.under(f".kvlistValue.values[{i}].value") from None
        return result

    def _check_depth(self, depth: int) -> None:
        if depth >= self.limits.max_depth:
            reason = f"nested deeper than {self.limits.max_depth} levels"
            raise BadValue("", reason, too_large=True)

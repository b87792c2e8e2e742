"""OTLP/JSON request bodies -> spans. Tolerates what real producers send besides canonical
OTLP/JSON: proto field names (`trace_id`), base64 ids (protobuf's generic JSON mapping),
protobufjs Buffers and Longs (langfuse fixtures), enum names, JS numbers for int64.

Errors travel up as `BadValue`, each level adding its path segment, so the hot loops format no
paths; `decode_json_request` turns them into `OtlpDecodeError`.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from typing import Any

import orjson

from services.ingest.otlp.json_values import (
    as_array,
    as_buffer,
    as_double,
    as_enum,
    as_int64,
    as_object,
    as_string,
    get_field,
    json_id,
    kind_of,
)
from services.ingest.otlp.spans import (
    SPAN_KINDS,
    STATUS_CODES,
    BadValue,
    Limits,
    OtlpDecodeError,
    OtlpTooLargeError,
    Span,
    SpanEvent,
    SpanStatus,
    ValueTooLarge,
)


def decode_json_request(raw: bytes, limits: Limits) -> list[Span]:
    """An OTLP/JSON `ExportTraceServiceRequest` -> its spans, in request order."""
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise OtlpDecodeError("body", f"not valid JSON ({exc})") from None
    decoder = _JsonDecoder(limits)
    try:
        decoder.request(doc)
    except BadValue as exc:
        raise exc.error() from None
    return decoder.spans


# --- messages -----------------------------------------------------------------------------------


class _JsonDecoder:
    """OTLP/JSON (and protobufjs-style JSON) -> spans."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.max_value = limits.max_value_bytes
        self.spans: list[Span] = []

    def request(self, doc: Any) -> None:
        root = as_object(doc, "")
        items = as_array(get_field(root, "resourceSpans", "resource_spans"), "resourceSpans")
        for i, item in enumerate(items):
            try:
                self._resource_spans(item)
            except BadValue as exc:
                raise exc.under(f"resourceSpans[{i}]") from None

    def _resource_spans(self, value: Any) -> None:
        item = as_object(value, "")
        resource = as_object(item.get("resource"), ".resource")
        try:
            attrs = self._attributes(resource.get("attributes"), {})
        except BadValue as exc:
            raise exc.under(".resource.attributes") from None
        scope_spans = as_array(get_field(item, "scopeSpans", "scope_spans"), ".scopeSpans")
        for j, scope_spans_value in enumerate(scope_spans):
            try:
                self._scope_spans(scope_spans_value, attrs)
            except BadValue as exc:
                raise exc.under(f".scopeSpans[{j}]") from None

    def _scope_spans(self, value: Any, resource: dict[str, Any]) -> None:
        item = as_object(value, "")
        scope = as_object(item.get("scope"), ".scope")
        scope_name = as_string(scope.get("name"), ".scope.name") or None
        scope_version = as_string(scope.get("version"), ".scope.version") or None
        for k, span in enumerate(as_array(item.get("spans"), ".spans")):
            if len(self.spans) >= self.limits.max_spans:
                raise OtlpTooLargeError("body", f"more than {self.limits.max_spans} spans")
            try:
                decoded = self._span(span, resource, scope_name, scope_version)
            except BadValue as exc:
                raise exc.under(f".spans[{k}]") from None
            self.spans.append(decoded)

    def _span(
        self,
        value: Any,
        resource: dict[str, Any],
        scope_name: str | None,
        scope_version: str | None,
    ) -> Span:
        item = as_object(value, "")
        oversized: dict[str, int] = {}
        try:
            attributes = self._attributes(item.get("attributes"), oversized)
        except BadValue as exc:
            raise exc.under(".attributes") from None
        status = as_object(item.get("status"), ".status")
        events = item.get("events")
        return Span(
            trace_id=str(json_id(get_field(item, "traceId", "trace_id"), 16, ".traceId")),
            span_id=str(json_id(get_field(item, "spanId", "span_id"), 8, ".spanId")),
            parent_span_id=json_id(
                get_field(item, "parentSpanId", "parent_span_id"), 8, ".parentSpanId", optional=True
            ),
            name=as_string(item.get("name"), ".name"),
            kind=as_enum(item.get("kind"), SPAN_KINDS, ".kind"),
            start_ns=as_int64(
                get_field(item, "startTimeUnixNano", "start_time_unix_nano"),
                ".startTimeUnixNano",
                unsigned=True,
            ),
            end_ns=as_int64(
                get_field(item, "endTimeUnixNano", "end_time_unix_nano"),
                ".endTimeUnixNano",
                unsigned=True,
            ),
            attributes=attributes,
            events=[] if events is None else self._events(events, oversized),
            status=SpanStatus(
                as_enum(status.get("code"), STATUS_CODES, ".status.code"),
                as_string(status.get("message"), ".status.message"),
            ),
            resource=resource,
            scope_name=scope_name,
            scope_version=scope_version,
            oversized=oversized,
        )

    def _events(self, value: Any, oversized: dict[str, int]) -> list[SpanEvent]:
        items = as_array(value, ".events")
        if len(items) > self.limits.max_events:
            raise BadValue(".events", f"more than {self.limits.max_events} events", too_large=True)
        events = []
        for n, event_value in enumerate(items):
            try:
                events.append(self._event(event_value, oversized))
            except BadValue as exc:
                raise exc.under(f".events[{n}]") from None
        return events

    def _event(self, value: Any, oversized: dict[str, int]) -> SpanEvent:
        event = as_object(value, "")
        name = as_string(event.get("name"), ".name")
        dropped: dict[str, int] = {}
        try:
            attrs = self._attributes(event.get("attributes"), dropped)
        except BadValue as exc:
            raise exc.under(".attributes") from None
        for key, size in dropped.items():
            oversized[f"{name}/{key}"] = size
        time_ns = as_int64(
            get_field(event, "timeUnixNano", "time_unix_nano"), ".timeUnixNano", unsigned=True
        )
        return SpanEvent(name, time_ns, attrs)

    def _attributes(self, value: Any, oversized: dict[str, int]) -> dict[str, Any]:
        """KeyValue list -> dict; values over the size limit go to `oversized` instead."""
        items = as_array(value, "")
        if len(items) > self.limits.max_attributes:
            reason = f"more than {self.limits.max_attributes} attributes"
            raise BadValue("", reason, too_large=True)
        attrs: dict[str, Any] = {}
        max_value = self.max_value
        for i, pair in enumerate(items):
            if not isinstance(pair, dict):
                raise BadValue(f"[{i}]", f"must be an object, not {kind_of(pair)}")
            key = pair.get("key")
            if not isinstance(key, str):
                raise BadValue(f"[{i}].key", "must be a string")
            value = pair.get("value")
            # Most attributes are `{"stringValue": "..."}`: read inline, as a call to `_value`
            # per attribute is a good part of the decode time. Anything else takes `_value`.
            if type(value) is dict and len(value) == 1:
                text = value.get("stringValue")
                if type(text) is str:
                    if len(text) > max_value:
                        oversized[key] = len(text)
                    else:
                        attrs[key] = text
                    continue
            try:
                attrs[key] = self._value(value, 0)
            except ValueTooLarge as exc:
                oversized[key] = exc.size
            except BadValue as exc:
                raise exc.under(f"[{i}].value") from None
        return attrs

    def _value(self, value: Any, depth: int) -> Any:
        """An AnyValue -> a plain Python value; `{}` (unset) -> None."""
        if value is None:
            return None
        if not isinstance(value, dict):
            raise BadValue("", f"must be an AnyValue object, not {kind_of(value)}")
        for key, item in value.items():
            if item is None:
                continue
            if key == "stringValue" and type(item) is str:  # the common case, kept inline
                if len(item) > self.max_value:
                    raise ValueTooLarge(len(item))
                return item
            reader = _JSON_VALUE_READERS.get(key)
            if reader is not None:
                try:
                    return reader(self, item, depth)
                except BadValue as exc:
                    raise exc.under(f".{key}") from None
        return None

    def _string(self, item: Any, depth: int) -> str:
        text = as_string(item, "")
        if len(text) > self.max_value:
            raise ValueTooLarge(len(text))
        return text

    def _bool(self, item: Any, depth: int) -> bool:
        if not isinstance(item, bool):
            raise BadValue("", f"must be a boolean, not {kind_of(item)}")
        return item

    def _int(self, item: Any, depth: int) -> int:
        return as_int64(item, "", unsigned=False)

    def _float(self, item: Any, depth: int) -> float:
        return as_double(item)

    def _bytes(self, item: Any, depth: int) -> bytes:
        if isinstance(item, str):
            if len(item) > self.max_value * 4 // 3 + 4:
                raise ValueTooLarge(len(item) * 3 // 4)
            try:
                return base64.b64decode(item + "=" * (-len(item) % 4), validate=True)
            except (binascii.Error, ValueError):
                raise BadValue("", "not valid base64") from None
        raw = as_buffer(item, "")
        if len(raw) > self.max_value:
            raise ValueTooLarge(len(raw))
        return raw

    def _array(self, item: Any, depth: int) -> list[Any]:
        self._check_depth(depth)
        values = as_array(as_object(item, "").get("values"), ".values")
        result = []
        for i, value in enumerate(values):
            try:
                result.append(self._value(value, depth + 1))
            except BadValue as exc:
                raise exc.under(f".values[{i}]") from None
        return result

    def _kvlist(self, item: Any, depth: int) -> dict[str, Any]:
        self._check_depth(depth)
        result: dict[str, Any] = {}
        for i, pair in enumerate(as_array(as_object(item, "").get("values"), ".values")):
            if not isinstance(pair, dict) or not isinstance(pair.get("key"), str):
                raise BadValue(f".values[{i}]", "must be an object with a string key")
            try:
                result[pair["key"]] = self._value(pair.get("value"), depth + 1)
            except BadValue as exc:
                raise exc.under(f".values[{i}].value") from None
        return result

    def _check_depth(self, depth: int) -> None:
        if depth >= self.limits.max_depth:
            reason = f"nested deeper than {self.limits.max_depth} levels"
            raise BadValue("", reason, too_large=True)


_JsonReader = Callable[[_JsonDecoder, Any, int], Any]
_JSON_VALUE_READERS: dict[str, _JsonReader] = {}
for _names, _reader in (
    (("stringValue", "string_value"), _JsonDecoder._string),
    (("boolValue", "bool_value"), _JsonDecoder._bool),
    (("intValue", "int_value"), _JsonDecoder._int),
    (("doubleValue", "double_value"), _JsonDecoder._float),
    (("arrayValue", "array_value"), _JsonDecoder._array),
    (("kvlistValue", "kvlist_value"), _JsonDecoder._kvlist),
    (("bytesValue", "bytes_value"), _JsonDecoder._bytes),
):
    for _name in _names:
        _JSON_VALUE_READERS[_name] = _reader

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

_UINT64_MAX = (1 << 64) - 1
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


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


# --- scalars ------------------------------------------------------------------------------------


def _get(obj: dict[str, Any], camel: str, snake: str) -> Any:
    """OTLP/JSON uses lowerCamelCase; protobuf JSON parsers also accept the proto field name."""
    value = obj.get(camel)
    return obj.get(snake) if value is None else value


def _kind(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}.get(
        type(value), "null" if value is None else "a number"
    )


def _obj(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadValue(where, f"must be an object, not {_kind(value)}")
    return value


def _arr(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise BadValue(where, f"must be an array, not {_kind(value)}")
    return value


def _str(value: Any, where: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise BadValue(where, f"must be a string, not {_kind(value)}")
    return value


def _int64(value: Any, where: str, *, unsigned: bool) -> int:
    """Decimal string, JSON number or protobufjs Long `{low, high, unsigned}`."""
    if value is None:
        return 0
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str):
        try:
            number = int(value)
        except ValueError:
            raise BadValue(where, f"not an integer: {value[:40]!r}") from None
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    elif isinstance(value, dict) and "low" in value and "high" in value:
        number = _long(value, where)
    else:
        raise BadValue(where, f"must be an integer, not {_kind(value)}")
    low, high = (0, _UINT64_MAX) if unsigned else (_INT64_MIN, _INT64_MAX)
    if not low <= number <= high:
        raise BadValue(where, f"{number} is out of range for a 64-bit integer")
    return number


def _long(value: dict[str, Any], where: str) -> int:
    low, high = value.get("low"), value.get("high")
    if not isinstance(low, int) or not isinstance(high, int):
        raise BadValue(where, "a Long needs integer low and high words")
    number = (low & 0xFFFFFFFF) | ((high & 0xFFFFFFFF) << 32)
    if not value.get("unsigned") and number >> 63:
        number -= 1 << 64  # two's complement, as protobufjs stores signed Longs
    return number


def _enum(value: Any, names: dict[str, int], where: str) -> int:
    if value is None:
        return 0
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        if value in names:
            return names[value]
        if value.isdigit():
            return int(value)
    raise BadValue(where, f"unknown enum value {str(value)[:40]!r}")


def _text_id(text: str, size: int, where: str) -> str:
    if len(text) == 2 * size:
        try:
            if len(bytes.fromhex(text)) == size:
                return text.lower()
        except ValueError:
            pass
    try:
        padded = text.replace("-", "+").replace("_", "/") + "=" * (-len(text) % 4)
        raw = base64.b64decode(padded, validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != size:
        raise BadValue(where, f"not {size} bytes (expected hex or base64)")
    return raw.hex()


def _buffer(value: Any, where: str) -> bytes:
    """A protobufjs Buffer `{"type": "Buffer", "data": [..]}` or a bare byte array."""
    data = value.get("data") if isinstance(value, dict) else value
    if not isinstance(data, list):
        raise BadValue(where, f"must be a hex string or byte buffer, not {_kind(value)}")
    try:
        return bytes(data)
    except (TypeError, ValueError):
        raise BadValue(where, "a byte buffer holds integers 0-255 only") from None


def _json_id(value: Any, size: int, where: str, *, optional: bool = False) -> str | None:
    if value is None or value == "":
        if optional:
            return None
        raise BadValue(where, f"not {size} bytes (missing)")
    if isinstance(value, str):
        hex_id = _text_id(value, size, where)
    else:
        raw = _buffer(value, where)
        if len(raw) != size:
            raise BadValue(where, f"not {size} bytes")
        hex_id = raw.hex()
    # Some exporters write an all-zero parent id for a root span.
    if optional and not hex_id.strip("0"):
        return None
    return hex_id


def _double(value: Any) -> float:
    if isinstance(value, bool):
        raise BadValue("", "must be a number, not a boolean")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):  # proto3 JSON writes "NaN", "Infinity" and may quote numbers
        try:
            return float(value)
        except ValueError:
            pass
    raise BadValue("", f"must be a number, not {_kind(value)}")


# --- messages -----------------------------------------------------------------------------------


class _JsonDecoder:
    """OTLP/JSON (and protobufjs-style JSON) -> spans."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.max_value = limits.max_value_bytes
        self.spans: list[Span] = []

    def request(self, doc: Any) -> None:
        root = _obj(doc, "")
        items = _arr(_get(root, "resourceSpans", "resource_spans"), "resourceSpans")
        for i, item in enumerate(items):
            try:
                self._resource_spans(item)
            except BadValue as exc:
                raise exc.under(f"resourceSpans[{i}]") from None

    def _resource_spans(self, value: Any) -> None:
        item = _obj(value, "")
        resource = _obj(item.get("resource"), ".resource")
        try:
            attrs = self._attributes(resource.get("attributes"), {})
        except BadValue as exc:
            raise exc.under(".resource.attributes") from None
        scope_spans = _arr(_get(item, "scopeSpans", "scope_spans"), ".scopeSpans")
        for j, scope_spans_value in enumerate(scope_spans):
            try:
                self._scope_spans(scope_spans_value, attrs)
            except BadValue as exc:
                raise exc.under(f".scopeSpans[{j}]") from None

    def _scope_spans(self, value: Any, resource: dict[str, Any]) -> None:
        item = _obj(value, "")
        scope = _obj(item.get("scope"), ".scope")
        scope_name = _str(scope.get("name"), ".scope.name") or None
        scope_version = _str(scope.get("version"), ".scope.version") or None
        for k, span in enumerate(_arr(item.get("spans"), ".spans")):
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
        item = _obj(value, "")
        oversized: dict[str, int] = {}
        try:
            attributes = self._attributes(item.get("attributes"), oversized)
        except BadValue as exc:
            raise exc.under(".attributes") from None
        status = _obj(item.get("status"), ".status")
        events = item.get("events")
        return Span(
            trace_id=str(_json_id(_get(item, "traceId", "trace_id"), 16, ".traceId")),
            span_id=str(_json_id(_get(item, "spanId", "span_id"), 8, ".spanId")),
            parent_span_id=_json_id(
                _get(item, "parentSpanId", "parent_span_id"), 8, ".parentSpanId", optional=True
            ),
            name=_str(item.get("name"), ".name"),
            kind=_enum(item.get("kind"), SPAN_KINDS, ".kind"),
            start_ns=_int64(
                _get(item, "startTimeUnixNano", "start_time_unix_nano"),
                ".startTimeUnixNano",
                unsigned=True,
            ),
            end_ns=_int64(
                _get(item, "endTimeUnixNano", "end_time_unix_nano"),
                ".endTimeUnixNano",
                unsigned=True,
            ),
            attributes=attributes,
            events=[] if events is None else self._events(events, oversized),
            status=SpanStatus(
                _enum(status.get("code"), STATUS_CODES, ".status.code"),
                _str(status.get("message"), ".status.message"),
            ),
            resource=resource,
            scope_name=scope_name,
            scope_version=scope_version,
            oversized=oversized,
        )

    def _events(self, value: Any, oversized: dict[str, int]) -> list[SpanEvent]:
        items = _arr(value, ".events")
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
        event = _obj(value, "")
        name = _str(event.get("name"), ".name")
        dropped: dict[str, int] = {}
        try:
            attrs = self._attributes(event.get("attributes"), dropped)
        except BadValue as exc:
            raise exc.under(".attributes") from None
        for key, size in dropped.items():
            oversized[f"{name}/{key}"] = size
        time_ns = _int64(
            _get(event, "timeUnixNano", "time_unix_nano"), ".timeUnixNano", unsigned=True
        )
        return SpanEvent(name, time_ns, attrs)

    def _attributes(self, value: Any, oversized: dict[str, int]) -> dict[str, Any]:
        """KeyValue list -> dict; values over the size limit go to `oversized` instead."""
        items = _arr(value, "")
        if len(items) > self.limits.max_attributes:
            reason = f"more than {self.limits.max_attributes} attributes"
            raise BadValue("", reason, too_large=True)
        attrs: dict[str, Any] = {}
        max_value = self.max_value
        for i, pair in enumerate(items):
            if not isinstance(pair, dict):
                raise BadValue(f"[{i}]", f"must be an object, not {_kind(pair)}")
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
            raise BadValue("", f"must be an AnyValue object, not {_kind(value)}")
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
        text = _str(item, "")
        if len(text) > self.max_value:
            raise ValueTooLarge(len(text))
        return text

    def _bool(self, item: Any, depth: int) -> bool:
        if not isinstance(item, bool):
            raise BadValue("", f"must be a boolean, not {_kind(item)}")
        return item

    def _int(self, item: Any, depth: int) -> int:
        return _int64(item, "", unsigned=False)

    def _float(self, item: Any, depth: int) -> float:
        return _double(item)

    def _bytes(self, item: Any, depth: int) -> bytes:
        if isinstance(item, str):
            if len(item) > self.max_value * 4 // 3 + 4:
                raise ValueTooLarge(len(item) * 3 // 4)
            try:
                return base64.b64decode(item + "=" * (-len(item) % 4), validate=True)
            except (binascii.Error, ValueError):
                raise BadValue("", "not valid base64") from None
        raw = _buffer(item, "")
        if len(raw) > self.max_value:
            raise ValueTooLarge(len(raw))
        return raw

    def _array(self, item: Any, depth: int) -> list[Any]:
        self._check_depth(depth)
        values = _arr(_obj(item, "").get("values"), ".values")
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
        for i, pair in enumerate(_arr(_obj(item, "").get("values"), ".values")):
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

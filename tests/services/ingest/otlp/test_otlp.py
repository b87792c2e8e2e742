"""OTLP/HTTP export requests -> spans (services/ingest/otlp/export.py): every transport variant in the
fixtures README's "Format facts", the errors that name what is wrong, the limits, and the
partial-success response."""

from __future__ import annotations

import gzip
import os
import zlib
from pathlib import Path
from typing import Any

import orjson
import pytest
from google.protobuf import json_format, text_format
from google.rpc.error_details_pb2 import BadRequest
from google.rpc.status_pb2 import Status
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans

from services.ingest.otlp.export import (
    Limits,
    OtlpDecodeError,
    OtlpTooLargeError,
    OtlpUnsupportedError,
    Span,
    decode_export,
    encode_response,
    encode_status,
)

JSON, PROTO = "application/json", "application/x-protobuf"


def fixtures_dir() -> Path:
    """The shared conformance fixtures: $TUNELOOP_FIXTURES_DIR, else ../shared/fixtures."""
    env = os.environ.get("TUNELOOP_FIXTURES_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[5] / "shared" / "fixtures"


OTLP = fixtures_dir() / "otlp"
needs_fixtures = pytest.mark.skipif(
    not OTLP.is_dir(), reason=f"OTLP fixtures not found at {OTLP} (set TUNELOOP_FIXTURES_DIR)"
)


def fixture_body(path: Path) -> tuple[bytes, str]:
    """A fixture file as an export request body and its Content-Type, the file left unchanged:
    langfuse objects are one ResourceSpans each, so they are wrapped; the protobuf text form is
    compiled with protobuf's own text parser; attribute maps go through `attribute_map_span`."""
    raw = path.read_bytes()
    if path.suffix == ".protobuf-bin":
        return raw, PROTO
    if path.suffix == ".protobuf-text":
        message = text_format.Parse(raw.decode(), ExportTraceServiceRequest())
        return message.SerializeToString(), PROTO
    if path.parent.name == "langfuse":
        return b'{"resourceSpans":[' + raw + b"]}", JSON
    if path.parent.name == "attribute-maps":
        return export_json([span_json(orjson.loads(raw), name="attribute map")]), JSON
    return raw, JSON


def any_value(value: Any) -> dict[str, Any]:
    """A Python value as an OTLP/JSON AnyValue."""
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, str):
        return {"stringValue": value}
    if isinstance(value, list):
        return {"arrayValue": {"values": [any_value(v) for v in value]}}
    if isinstance(value, dict):
        pairs = [{"key": k, "value": any_value(v)} for k, v in value.items()]
        return {"kvlistValue": {"values": pairs}}
    return {}


def span_json(
    attributes: dict[str, Any],
    *,
    trace_id: str = "0af7651916cd43dd8448eb211c80319c",
    span_id: str = "b7ad6b7169203331",
    parent: str | None = None,
    name: str = "chat",
    start: int = 1_700_000_000_000_000_000,
    end: int = 1_700_000_001_000_000_000,
    events: list[dict[str, Any]] | None = None,
    status: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One OTLP/JSON span; attribute values are plain Python values."""
    span: dict[str, Any] = {
        "traceId": trace_id,
        "spanId": span_id,
        "name": name,
        "kind": 3,
        "startTimeUnixNano": str(start),
        "endTimeUnixNano": str(end),
        "attributes": [{"key": k, "value": any_value(v)} for k, v in attributes.items()],
        "events": events or [],
        "status": status or {},
    }
    if parent:
        span["parentSpanId"] = parent
    return span


def export_json(spans: list[dict[str, Any]], resource: dict[str, Any] | None = None) -> bytes:
    resource_attrs = [{"key": k, "value": any_value(v)} for k, v in (resource or {}).items()]
    scope = {"scope": {"name": "test"}, "spans": spans}
    return orjson.dumps(
        {"resourceSpans": [{"resource": {"attributes": resource_attrs}, "scopeSpans": [scope]}]}
    )


def proto_value(value: Any) -> AnyValue:
    """A decoded attribute value back into a protobuf AnyValue."""
    out = AnyValue()
    if isinstance(value, bool):
        out.bool_value = value
    elif isinstance(value, int):
        out.int_value = value
    elif isinstance(value, float):
        out.double_value = value
    elif isinstance(value, str):
        out.string_value = value
    elif isinstance(value, bytes):
        out.bytes_value = value
    elif isinstance(value, list):
        out.array_value.values.extend(proto_value(v) for v in value)
    elif isinstance(value, dict):
        for key, item in value.items():
            out.kvlist_value.values.add(key=key, value=proto_value(item))
    return out


def spans_to_proto(spans: list[Span]) -> bytes:
    """Decoded spans re-encoded as a binary ExportTraceServiceRequest (one ResourceSpans each)."""
    request = ExportTraceServiceRequest()
    for span in spans:
        rs: ResourceSpans = request.resource_spans.add()
        for key, value in span.resource.items():
            rs.resource.attributes.add(key=key, value=proto_value(value))
        ss = rs.scope_spans.add()
        ss.scope.name = span.scope_name or ""
        ss.scope.version = span.scope_version or ""
        out = ss.spans.add(
            trace_id=bytes.fromhex(span.trace_id),
            span_id=bytes.fromhex(span.span_id),
            parent_span_id=bytes.fromhex(span.parent_span_id or ""),
            name=span.name,
            kind=span.kind,
            start_time_unix_nano=span.start_ns,
            end_time_unix_nano=span.end_ns,
        )
        out.status.code = span.status.code
        out.status.message = span.status.message
        for key, value in span.attributes.items():
            out.attributes.add(key=key, value=proto_value(value))
        for event in span.events:
            added = out.events.add(name=event.name, time_unix_nano=event.time_ns)
            for key, value in event.attributes.items():
                added.attributes.add(key=key, value=proto_value(value))
    return bytes(request.SerializeToString())


def json_fixtures() -> list[Path]:
    if not OTLP.is_dir():
        return []
    return sorted(
        p for folder in ("exports", "derived", "langfuse") for p in (OTLP / folder).glob("*.json")
    )


# --- fixtures --------------------------------------------------------------------------------


@needs_fixtures
def test_ot02_protobuf_decodes_to_the_same_spans_as_ot01_json() -> None:
    exports = OTLP / "exports"
    from_json = decode_export((exports / "ot01_otlp_proto_example_trace.json").read_bytes(), JSON)
    from_proto = decode_export(
        (exports / "ot02_otlp_proto_example_trace.protobuf-bin").read_bytes(), PROTO
    )
    assert from_proto == from_json
    span = from_json[0]
    assert span.trace_id == "5b8efff798038103d269b633813fc60c"  # upper case in the file
    assert span.parent_span_id == "eee19b7ec3c1b173"
    assert (span.kind, span.start_ns) == (2, 1544712660000000000)
    assert span.resource == {"service.name": "my.service"}
    assert (span.scope_name, span.scope_version) == ("my.library", "1.0.0")


@needs_fixtures
def test_protobuf_generic_json_mapping_base64_ids_and_enum_names() -> None:
    """protobuf's own JSON writer emits base64 ids and enum names (the ot03-ot05 shape)."""
    exports = OTLP / "exports"
    message = ExportTraceServiceRequest()
    message.ParseFromString((exports / "ot02_otlp_proto_example_trace.protobuf-bin").read_bytes())
    generic = json_format.MessageToJson(message).encode()
    assert b'"W47/95gDgQPSabYzgT/GDA=="' in generic
    assert b"SPAN_KIND_SERVER" in generic
    expected = decode_export((exports / "ot01_otlp_proto_example_trace.json").read_bytes(), JSON)
    assert decode_export(generic, JSON) == expected
    snake = json_format.MessageToJson(message, preserving_proto_field_name=True).encode()
    assert decode_export(snake, "application/json; charset=utf-8") == expected


@needs_fixtures
@pytest.mark.parametrize("path", json_fixtures(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_json_fixture_reencoded_as_protobuf_decodes_the_same(path: Path) -> None:
    body, content_type = fixture_body(path)
    spans = decode_export(body, content_type)
    assert spans
    assert decode_export(spans_to_proto(spans), PROTO) == spans


@needs_fixtures
@pytest.mark.parametrize(
    "path",
    sorted((OTLP / "langfuse").glob("*.json")) if OTLP.is_dir() else [],
    ids=lambda p: p.name,
)
def test_langfuse_protobufjs_objects_match_their_canonical_copies(path: Path) -> None:
    """Buffer ids and {low, high, unsigned} Longs decode like hex ids and decimal strings."""
    body, _ = fixture_body(path)
    derived = OTLP / "derived" / path.name.replace(".json", ".otlp.json")
    assert decode_export(body, JSON) == decode_export(derived.read_bytes(), JSON)


@needs_fixtures
def test_protobufjs_signed_long_minus_one() -> None:
    body, _ = fixture_body(OTLP / "langfuse" / "lf01_openlit_events_gen_ai_content_prompt.json")
    (span,) = decode_export(body, JSON)
    assert span.attributes["gen_ai.request.max_tokens"] == -1
    assert span.start_ns == 1738074845669299666


@needs_fixtures
@pytest.mark.parametrize("encoding", ["gzip", "x-gzip", "deflate", "GZIP"])
def test_compressed_bodies(encoding: str) -> None:
    raw = (
        OTLP / "exports" / "ot07_interlingua_openllmetry_0.62_semconv_messages_captured.json"
    ).read_bytes()
    squeeze = gzip.compress if "gzip" in encoding.lower() else zlib.compress
    expected = decode_export(raw, JSON)
    assert decode_export(squeeze(raw), JSON, encoding) == expected
    assert decode_export(squeeze(spans_to_proto(expected)), PROTO, encoding) == expected


# --- transport variants -----------------------------------------------------------------------


def _decode_one(span: dict[str, Any]) -> Span:
    (decoded,) = decode_export(
        orjson.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}), JSON
    )
    return decoded


@pytest.mark.parametrize(
    ("trace_id", "span_id"),
    [
        ("0AF7651916CD43DD8448EB211C80319C", "B7AD6B7169203331"),
        ("CvdlGRbNQ92ESOshHIAxnA==", "t61rcWkgMzE="),  # base64 (protobuf generic JSON)
        ("CvdlGRbNQ92ESOshHIAxnA", "t61rcWkgMzE"),  # unpadded
        (
            {"type": "Buffer", "data": list(bytes.fromhex("0af7651916cd43dd8448eb211c80319c"))},
            {"type": "Buffer", "data": list(bytes.fromhex("b7ad6b7169203331"))},
        ),
    ],
)
def test_id_encodings(trace_id: Any, span_id: Any) -> None:
    span = _decode_one({"traceId": trace_id, "spanId": span_id})
    assert (span.trace_id, span.span_id) == ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331")


@pytest.mark.parametrize("parent", [None, "", "0000000000000000", "AAAAAAAAAAA="])
def test_missing_empty_or_zero_parent_means_root(parent: Any) -> None:
    span = {"traceId": "0af7651916cd43dd8448eb211c80319c", "spanId": "b7ad6b7169203331"}
    if parent is not None:
        span["parentSpanId"] = parent
    assert _decode_one(span).parent_span_id is None


@pytest.mark.parametrize(
    "value",
    [
        "1700000000000000000",
        1700000000000000000,
        {"low": 908722176, "high": 395812094, "unsigned": True},
    ],
)
def test_int64_encodings(value: Any) -> None:
    span = _decode_one(
        {
            "traceId": "0af7651916cd43dd8448eb211c80319c",
            "spanId": "b7ad6b7169203331",
            "startTimeUnixNano": value,
        }
    )
    assert span.start_ns == 1700000000000000000


def test_enum_names_status_and_anyvalue_variants() -> None:
    span = _decode_one(
        {
            "trace_id": "0af7651916cd43dd8448eb211c80319c",
            "span_id": "b7ad6b7169203331",
            "kind": "SPAN_KIND_CLIENT",
            "status": {"code": "STATUS_CODE_ERROR", "message": "boom"},
            "attributes": [
                {"key": "s", "value": {"stringValue": "x"}},
                {"key": "i", "value": {"intValue": "-7"}},
                {"key": "n", "value": {"intValue": 42}},
                {"key": "l", "value": {"intValue": {"low": -1, "high": -1, "unsigned": False}}},
                {"key": "d", "value": {"doubleValue": 0.5}},
                {"key": "nan", "value": {"doubleValue": "NaN"}},
                {"key": "b", "value": {"boolValue": True}},
                {"key": "bytes", "value": {"bytesValue": "aGk="}},
                {"key": "empty_array", "value": {"arrayValue": {}}},
                {"key": "unset", "value": {}},
                {
                    "key": "kv",
                    "value": {
                        "kvlistValue": {"values": [{"key": "a", "value": {"intValue": "1"}}]}
                    },
                },
                {
                    "key": "nested",
                    "value": {"arrayValue": {"values": [{"stringValue": "a"}, {"arrayValue": {}}]}},
                },
            ],
        }
    )
    assert (span.kind, span.status.code, span.status.message) == (3, 2, "boom")
    attrs = dict(span.attributes)
    nan = attrs.pop("nan")
    assert nan != nan
    assert attrs == {
        "s": "x",
        "i": -7,
        "n": 42,
        "l": -1,
        "d": 0.5,
        "b": True,
        "bytes": b"hi",
        "empty_array": [],
        "unset": None,
        "kv": {"a": 1},
        "nested": ["a", []],
    }
    assert (
        _decode_one(
            {
                "traceId": "0af7651916cd43dd8448eb211c80319c",
                "spanId": "b7ad6b7169203331",
                "status": {},
            }
        ).status.code
        == 0
    )


# --- errors -------------------------------------------------------------------------------------


def _request(*spans: dict[str, Any], scopes: int = 1) -> bytes:
    scope_spans: list[dict[str, Any]] = [{"spans": []} for _ in range(scopes - 1)]
    scope_spans.append({"spans": list(spans)})
    return orjson.dumps({"resourceSpans": [{"scopeSpans": scope_spans}]})


GOOD = {"traceId": "0af7651916cd43dd8448eb211c80319c", "spanId": "b7ad6b7169203331"}


@pytest.mark.parametrize(
    ("body", "path", "reason"),
    [
        (
            _request(GOOD, GOOD, GOOD, {**GOOD, "traceId": "abcd"}, scopes=2),
            "resourceSpans[0].scopeSpans[1].spans[3].traceId",
            "not 16 bytes",
        ),
        (
            _request({**GOOD, "spanId": None}),
            "resourceSpans[0].scopeSpans[0].spans[0].spanId",
            "not 8 bytes",
        ),
        (
            _request({**GOOD, "spanId": {"type": "Buffer", "data": [1, 2, 300]}}),
            "resourceSpans[0].scopeSpans[0].spans[0].spanId",
            "0-255",
        ),
        (
            _request({**GOOD, "startTimeUnixNano": "soon"}),
            "resourceSpans[0].scopeSpans[0].spans[0].startTimeUnixNano",
            "not an integer",
        ),
        (
            _request({**GOOD, "startTimeUnixNano": "-5"}),
            "resourceSpans[0].scopeSpans[0].spans[0].startTimeUnixNano",
            "out of range",
        ),
        (
            _request({**GOOD, "kind": "SPAN_KIND_WEIRD"}),
            "resourceSpans[0].scopeSpans[0].spans[0].kind",
            "unknown enum",
        ),
        (
            _request({**GOOD, "attributes": [{"key": 1, "value": {}}]}),
            "resourceSpans[0].scopeSpans[0].spans[0].attributes[0].key",
            "string",
        ),
        (
            _request({**GOOD, "attributes": [{"key": "k", "value": {"intValue": 1.5}}]}),
            "resourceSpans[0].scopeSpans[0].spans[0].attributes[0].value.intValue",
            "integer",
        ),
        (
            _request({**GOOD, "attributes": [{"key": "k", "value": {"bytesValue": "!!"}}]}),
            "resourceSpans[0].scopeSpans[0].spans[0].attributes[0].value.bytesValue",
            "base64",
        ),
        (b'{"resourceSpans": {}}', "resourceSpans", "must be an array"),
        (
            b'{"resourceSpans": [{"scopeSpans": [{"spans": [7]}]}]}',
            "resourceSpans[0].scopeSpans[0].spans[0]",
            "must be an object",
        ),
        (b"[1, 2]", "body", "must be an object"),
        (b"{not json", "body", "not valid JSON"),
    ],
)
def test_malformed_json_names_the_field(body: bytes, path: str, reason: str) -> None:
    with pytest.raises(OtlpDecodeError) as info:
        decode_export(body, JSON)
    assert info.value.path == path
    assert reason in info.value.reason


def test_malformed_protobuf_and_transport_errors() -> None:
    with pytest.raises(OtlpDecodeError, match="body: not a valid ExportTraceServiceRequest"):
        decode_export(b"\x0a\xff\xff\xff\xff\x0f", PROTO)
    request = ExportTraceServiceRequest()
    request.resource_spans.add().scope_spans.add().spans.add(trace_id=b"short", span_id=b"12345678")
    with pytest.raises(OtlpDecodeError, match=r"spans\[0\]\.traceId: not 16 bytes"):
        decode_export(request.SerializeToString(), PROTO)
    with pytest.raises(OtlpUnsupportedError, match="Content-Type"):
        decode_export(b"{}", "text/plain")
    with pytest.raises(OtlpUnsupportedError, match="Content-Encoding"):
        decode_export(b"{}", JSON, "br")
    with pytest.raises(OtlpDecodeError, match="not valid gzip"):
        decode_export(b"not gzip at all", JSON, "gzip")
    with pytest.raises(OtlpDecodeError, match="truncated"):
        decode_export(gzip.compress(b'{"resourceSpans": []}')[:-12], JSON, "gzip")
    assert decode_export(gzip.compress(b"{") + gzip.compress(b"}"), JSON, "gzip") == []  # members


def test_empty_bodies_are_empty_requests() -> None:
    assert decode_export(b"", PROTO) == []
    assert decode_export(b"{}", JSON) == []


# --- limits -------------------------------------------------------------------------------------


def test_gzip_bomb_stops_at_the_body_limit() -> None:
    bomb = gzip.compress(b"{" + b" " * (8 << 20) + b"}")
    assert len(bomb) < 64 << 10
    with pytest.raises(OtlpTooLargeError, match="decompresses to more than"):
        decode_export(bomb, JSON, "gzip", limits=Limits(max_body_bytes=1 << 20))


def test_span_count_and_depth_limits() -> None:
    spans = [{**GOOD, "spanId": f"{i:016x}"} for i in range(1, 12)]
    with pytest.raises(OtlpTooLargeError, match="more than 10 spans"):
        decode_export(_request(*spans), JSON, limits=Limits(max_spans=10))
    deep: dict[str, Any] = {"stringValue": "x"}
    for _ in range(20):
        deep = {"arrayValue": {"values": [deep]}}
    with pytest.raises(OtlpTooLargeError, match="nested deeper than 16"):
        decode_export(_request({**GOOD, "attributes": [{"key": "k", "value": deep}]}), JSON)


def test_oversized_values_are_left_out_and_listed() -> None:
    limits = Limits(max_value_bytes=100)
    big = "x" * 101
    span = {
        **GOOD,
        "attributes": [
            {"key": "small", "value": {"stringValue": "ok"}},
            {"key": "big", "value": {"stringValue": big}},
        ],
        "events": [
            {
                "name": "e",
                "attributes": [
                    {"key": "content", "value": {"arrayValue": {"values": [{"stringValue": big}]}}}
                ],
            }
        ],
    }
    (decoded,) = decode_export(_request(span), JSON, limits=limits)
    assert decoded.attributes == {"small": "ok"}
    assert decoded.oversized == {"big": 101, "e/content": 101}
    (from_proto,) = decode_export(
        spans_to_proto([decode_export(_request(span), JSON)[0]]), PROTO, limits=limits
    )
    assert from_proto.oversized == decoded.oversized


# --- response -------------------------------------------------------------------------------------


def test_partial_success_response_in_both_encodings() -> None:
    body = encode_response(2, "2 span(s) rejected: ...", JSON)
    assert orjson.loads(body) == {
        "partialSuccess": {"rejectedSpans": "2", "errorMessage": "2 span(s) rejected: ..."}
    }
    parsed = ExportTraceServiceResponse()
    parsed.ParseFromString(encode_response(2, "why", PROTO))
    assert (parsed.partial_success.rejected_spans, parsed.partial_success.error_message) == (
        2,
        "why",
    )
    assert orjson.loads(encode_response(0, "", JSON)) == {}
    assert encode_response(0, "", PROTO) == b""


def test_failure_status_in_the_requests_encoding_with_the_bad_field() -> None:
    path = "resourceSpans[0].scopeSpans[0].spans[3].traceId"
    body, mime = encode_status(3, f"{path}: not 16 bytes", f"{PROTO}; charset=binary", field=path)
    assert mime == PROTO
    status = Status.FromString(body)
    assert (status.code, status.message) == (3, f"{path}: not 16 bytes")
    [detail] = status.details
    bad = BadRequest()
    assert detail.Unpack(bad)
    assert [(v.field, v.description) for v in bad.field_violations] == [
        (path, f"{path}: not 16 bytes")
    ]

    body, mime = encode_status(3, "x: bad", JSON, field="x")
    assert mime == JSON
    assert orjson.loads(body) == {
        "code": 3,
        "message": "x: bad",
        "details": [
            {
                "@type": "type.googleapis.com/google.rpc.BadRequest",
                "fieldViolations": [{"field": "x", "description": "x: bad"}],
            }
        ],
    }
    # Without a field, no details; an encoding OTLP does not have is answered in JSON.
    assert orjson.loads(encode_status(16, "no key", JSON)[0]) == {"code": 16, "message": "no key"}
    assert encode_status(3, "text/plain is not supported", "text/plain")[1] == JSON
    assert encode_status(3, "no Content-Type", None)[1] == JSON


# --- hostile input --------------------------------------------------------------------------------

_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=40),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=30,
)
_keys = st.sampled_from(
    [
        "resourceSpans",
        "scopeSpans",
        "spans",
        "traceId",
        "spanId",
        "parentSpanId",
        "attributes",
        "key",
        "value",
        "stringValue",
        "intValue",
        "arrayValue",
        "kvlistValue",
        "values",
        "bytesValue",
        "events",
        "status",
        "code",
        "kind",
        "startTimeUnixNano",
        "low",
        "high",
        "data",
        "type",
    ]
)
_otlp_like = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**65), 2**65)
    | st.text(max_size=40)
    | st.just("0af7651916cd43dd8448eb211c80319c"),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_keys, inner, max_size=4),
    max_leaves=40,
)


def _decode_or_error(body: bytes, content_type: str, encoding: str | None = None) -> None:
    try:
        spans = decode_export(body, content_type, encoding)
    except OtlpDecodeError:
        return
    assert all(isinstance(span, Span) for span in spans)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    body=st.binary(max_size=400),
    content_type=st.sampled_from([JSON, PROTO]),
    encoding=st.sampled_from([None, "gzip", "deflate"]),
)
def test_garbage_bytes_only_raise_decode_errors(
    body: bytes, content_type: str, encoding: str | None
) -> None:
    _decode_or_error(body, content_type, encoding)


@settings(max_examples=300, deadline=None)
@given(doc=_json_values | _otlp_like)
def test_garbage_json_only_raises_decode_errors(doc: Any) -> None:
    body = orjson.dumps(doc, option=orjson.OPT_NON_STR_KEYS) if not _too_big(doc) else b"{}"
    _decode_or_error(body, JSON)
    _decode_or_error(
        orjson.dumps(
            {"resourceSpans": [{"scopeSpans": [{"spans": [doc]}]}]}, option=orjson.OPT_NON_STR_KEYS
        )
        if not _too_big(doc)
        else b"{}",
        JSON,
    )


def _too_big(doc: Any) -> bool:
    try:
        orjson.dumps(doc)
    except orjson.JSONEncodeError:
        return True  # ints beyond 64 bits: not JSON orjson can write; covered by bytes tests
    return False


@needs_fixtures
@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_mutated_protobuf_only_raises_decode_errors(data: st.DataObject) -> None:
    raw = bytearray((OTLP / "exports" / "ot02_otlp_proto_example_trace.protobuf-bin").read_bytes())
    for _ in range(data.draw(st.integers(1, 6))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(raw)))
    _decode_or_error(bytes(raw[:cut]), PROTO)
    _decode_or_error(bytes(raw), PROTO)

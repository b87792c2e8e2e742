"""OTLP/HTTP trace export requests -> a neutral span model, and the export response.

Reads every transport variant real exporters send (fixtures README, "Format facts"): protobuf
and JSON bodies, gzip or deflate, ids as hex in any case, base64 (protobuf's generic JSON
mapping) or protobufjs Buffer objects, int64 as decimal strings, numbers or protobufjs Longs,
enums as ints or names. Knows nothing about GenAI: `genai_spans` reads the `Span`s this returns.
Every way a body can be wrong ends in `OtlpDecodeError`, naming where.
"""

from __future__ import annotations

import zlib

import orjson
from google.protobuf import json_format
from google.rpc.error_details_pb2 import BadRequest
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from services.ingest.otlp.decode_json import decode_json_request
from services.ingest.otlp.decode_proto import decode_proto_request
from services.ingest.otlp.spans import (
    DEFAULT_LIMITS,
    SPAN_KINDS,
    STATUS_CODES,
    STATUS_ERROR,
    STATUS_OK,
    STATUS_UNSET,
    Limits,
    OtlpDecodeError,
    OtlpTooLargeError,
    OtlpUnsupportedError,
    Span,
    SpanEvent,
    SpanStatus,
)

__all__ = [
    "DEFAULT_LIMITS",
    "SPAN_KINDS",
    "STATUS_CODES",
    "STATUS_ERROR",
    "STATUS_OK",
    "STATUS_UNSET",
    "Limits",
    "OtlpDecodeError",
    "OtlpTooLargeError",
    "OtlpUnsupportedError",
    "Span",
    "SpanEvent",
    "SpanStatus",
    "decode_export",
    "encode_response",
    "encode_status",
    "media_type",
]

_JSON_TYPES = frozenset({"application/json"})
_PROTO_TYPES = frozenset({"application/x-protobuf", "application/protobuf"})


def decode_export(
    body: bytes,
    content_type: str,
    content_encoding: str | None = None,
    *,
    limits: Limits = DEFAULT_LIMITS,
) -> list[Span]:
    """An OTLP/HTTP `ExportTraceServiceRequest` body -> its spans, in request order."""
    media = media_type(content_type)
    raw = _decompress(body, content_encoding, limits)
    if media == "json":
        return decode_json_request(raw, limits)
    return decode_proto_request(raw, limits)


def media_type(content_type: str | None) -> str:
    """ "json" or "protobuf" for a Content-Type header; anything else is unsupported."""
    mime = (content_type or "").split(";", 1)[0].strip().lower()
    if mime in _JSON_TYPES:
        return "json"
    if mime in _PROTO_TYPES:
        return "protobuf"
    raise OtlpUnsupportedError(
        "Content-Type",
        f"{content_type!r} is not supported (use application/x-protobuf or application/json)",
    )


def encode_response(rejected_count: int, message: str, content_type: str) -> bytes:
    """The `ExportTraceServiceResponse` body, in the request's encoding. `partial_success` is set
    only when something was rejected or there is a message, as the OTLP spec asks."""
    response = ExportTraceServiceResponse()
    if rejected_count or message:
        response.partial_success.rejected_spans = rejected_count
        response.partial_success.error_message = message
    if media_type(content_type) == "json":
        return orjson.dumps(json_format.MessageToDict(response))
    return bytes(response.SerializeToString())


def encode_status(
    code: int, message: str, content_type: str | None, *, field: str | None = None
) -> tuple[bytes, str]:
    """A failure answer's body and Content-Type: OTLP/HTTP wants a `google.rpc.Status` in the
    request's encoding for every 4xx and 5xx (JSON when the request's Content-Type is not one
    of OTLP's, since no other encoding was asked for). `code` is a `google.rpc.Code`; `field`,
    the path of what made a body bad, goes into a `google.rpc.BadRequest` detail, as the spec
    suggests for a 400."""
    status = Status(code=code, message=message)
    if field is not None:
        violation = BadRequest.FieldViolation(field=field, description=message)
        status.details.add().Pack(BadRequest(field_violations=[violation]))
    try:
        json = media_type(content_type) == "json"
    except OtlpUnsupportedError:
        json = True
    if json:
        return orjson.dumps(json_format.MessageToDict(status)), "application/json"
    return bytes(status.SerializeToString()), "application/x-protobuf"


# --- transport --------------------------------------------------------------------------------


def _decompress(body: bytes, encoding: str | None, limits: Limits) -> bytes:
    name = (encoding or "identity").strip().lower()
    if name in ("", "identity"):
        data = body
    elif name in ("gzip", "x-gzip"):
        data = _inflate(body, 16 + zlib.MAX_WBITS, "gzip", limits.max_body_bytes)
    elif name == "deflate":
        data = _inflate(body, zlib.MAX_WBITS, "deflate", limits.max_body_bytes)
    else:
        raise OtlpUnsupportedError(
            "Content-Encoding", f"{encoding!r} is not supported (use gzip or none)"
        )
    if len(data) > limits.max_body_bytes:
        raise OtlpTooLargeError("body", f"larger than {limits.max_body_bytes} bytes")
    return data


def _inflate(body: bytes, wbits: int, name: str, limit: int) -> bytes:
    """Decompress at most `limit` + 1 bytes, so a small bomb never expands in memory.
    Concatenated gzip members (valid gzip) are read one after another."""
    out = bytearray()
    rest = body
    while True:
        stream = zlib.decompressobj(wbits)
        try:
            out += stream.decompress(rest, limit + 1 - len(out))
        except zlib.error as exc:
            raise OtlpDecodeError("body", f"not valid {name} data ({exc})") from None
        if len(out) > limit or stream.unconsumed_tail:
            raise OtlpTooLargeError("body", f"decompresses to more than {limit} bytes")
        if not stream.eof:
            raise OtlpDecodeError("body", f"{name} data is truncated")
        rest = stream.unused_data
        if not rest:
            return bytes(out)

"""OTLP/HTTP trace export -> samples, with the OTLP partial-success answer.

The decoding and GenAI mapping live in export.py and genai_spans.py and run where workers.py
decides (a pool process for a large export); this module hands one request's samples to the
capture pipeline and words the answer. `TraceReceiver` serves `POST /v1/traces` as raw ASGI,
ahead of FastAPI like the proxied calls (gateway/fastpath.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from google.rpc.code_pb2 import (
    INVALID_ARGUMENT,
    PERMISSION_DENIED,
    RESOURCE_EXHAUSTED,
    UNAUTHENTICATED,
    UNAVAILABLE,
)
from starlette.types import Receive, Scope, Send

from services.ingest.capture.pipeline import CapturePipeline
from services.ingest.gateway.calls import BodyTooLarge, Gateway
from services.ingest.otlp.export import (
    OtlpDecodeError,
    OtlpTooLargeError,
    OtlpUnsupportedError,
    encode_response,
    encode_status,
    media_type,
)
from services.ingest.otlp.genai_spans import summarize_rejections
from services.ingest.otlp.workers import ExportMapper, MapperUnavailable
from shared.auth import AuthError, ScopeError

# The failure answers' google.rpc.Code values (INVALID_ARGUMENT, ...): OTLP clients go by the
# HTTP status (429, 502, 503 and 504 are retried, every other failure is not); the code is for
# their logs.
# What a 503 asks an exporter to wait before sending the export again: a mapping process is
# replaced within a second or two.
RETRY_AFTER_S = 1


@dataclass
class ExportOutcome:
    body: bytes
    media_type: str
    samples: int
    rejected: int


async def export_traces(
    pipeline: CapturePipeline,
    mapper: ExportMapper,
    *,
    body: bytes,
    content_type: str,
    content_encoding: str | None,
    tenant: str,
) -> ExportOutcome:
    """Raises OtlpDecodeError (and its subclasses) for a body that is not a valid export, and
    MapperUnavailable when the process mapping it died."""
    mapped = await mapper.map(body, content_type, content_encoding, tenant)
    for note in mapped.dropped:
        pipeline.fidelity.count_dropped(tenant, "otlp", note.reason)
    for span in mapped.rejected:
        pipeline.fidelity.count_rejected(tenant, "otlp", span.reason)
    await pipeline.deliver_prepared(mapped.prepared)
    if mapped.with_media:
        await pipeline.deliver_many(mapped.with_media)
    answer = encode_response(
        len(mapped.rejected), summarize_rejections(mapped.rejected), content_type
    )
    mime = "application/json" if media_type(content_type) == "json" else "application/x-protobuf"
    return ExportOutcome(answer, mime, mapped.samples, len(mapped.rejected))


@dataclass
class ExportFailure:
    """A failed export's answer: HTTP status, a `google.rpc.Status` body in the request's
    encoding, and headers (Retry-After on a 503)."""

    status_code: int
    body: bytes
    media_type: str
    headers: dict[str, str]


def failure(
    status_code: int, code: int, message: str, content_type: str | None, *, field: str | None = None
) -> ExportFailure:
    body, mime = encode_status(code, message, content_type, field=field)
    headers = {"Retry-After": str(RETRY_AFTER_S)} if status_code == 503 else {}
    return ExportFailure(status_code, body, mime, headers)


def export_failure(
    exc: OtlpDecodeError | MapperUnavailable, content_type: str | None
) -> ExportFailure:
    """The answer to an export `export_traces` raised for: 415 for a Content-Type or
    Content-Encoding it does not read, 413 over a size limit, 400 (with the path of what is
    wrong) for a body that is not a valid export, which must not be sent again, and 503 when
    the process mapping it died, which exporters retry."""
    if isinstance(exc, MapperUnavailable):
        return failure(503, UNAVAILABLE, str(exc), content_type)
    if isinstance(exc, OtlpUnsupportedError):
        return failure(415, INVALID_ARGUMENT, str(exc), content_type)
    if isinstance(exc, OtlpTooLargeError):
        return failure(413, RESOURCE_EXHAUSTED, str(exc), content_type)
    return failure(400, INVALID_ARGUMENT, str(exc), content_type, field=exc.path)


class TraceReceiver:
    """`POST /v1/traces` as a raw ASGI endpoint. Served ahead of FastAPI (gateway/fastpath.py), an
    export pays no framework routing, dependency resolution, middleware or per-request span:
    for a small export (an SDK sending a trace or two at a time) those cost more than decoding
    it. Authenticates like the proxy (any of the SDKs' key headers), reads at most the body
    limit, and answers every failure as OTLP asks (`export_failure`)."""

    def __init__(self, gateway: Gateway, pipeline: CapturePipeline, mapper: ExportMapper) -> None:
        self._gateway = gateway
        self._pipeline = pipeline
        self._mapper = mapper

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers: list[tuple[bytes, bytes]] = scope["headers"]
        answer = await self.answer(scope, receive, headers)
        if isinstance(answer, ExportOutcome):
            status, body, mime, extra = 200, answer.body, answer.media_type, {}
        else:
            status, body, mime, extra = (
                answer.status_code, answer.body, answer.media_type, answer.headers,
            )  # fmt: skip
        raw = [
            (b"content-type", mime.encode()),
            (b"content-length", str(len(body)).encode()),
            *self._gateway.served_by,
            *((name.lower().encode(), value.encode()) for name, value in extra.items()),
        ]
        await send({"type": "http.response.start", "status": status, "headers": raw})
        await send({"type": "http.response.body", "body": body})

    async def answer(
        self, scope: Scope, receive: Receive, headers: list[tuple[bytes, bytes]]
    ) -> ExportOutcome | ExportFailure:
        content_type = _header(headers, b"content-type")
        try:
            tenant, body = await self._gateway.admit(scope, receive)
        except AuthError as exc:
            return failure(401, UNAUTHENTICATED, str(exc), content_type)
        except ScopeError as exc:
            return failure(403, PERMISSION_DENIED, str(exc), content_type)
        except BodyTooLarge as exc:
            return failure(413, RESOURCE_EXHAUSTED, str(exc), content_type)
        try:
            return await export_traces(
                self._pipeline,
                self._mapper,
                body=body,
                content_type=content_type or "",
                content_encoding=_header(headers, b"content-encoding"),
                tenant=tenant,
            )
        except (OtlpDecodeError, MapperUnavailable) as exc:
            return export_failure(exc, content_type)


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> str | None:
    """The first value of a header (ASGI header names are lower-case)."""
    return next((value.decode("latin-1") for key, value in headers if key == name), None)

"""OTLP/HTTP trace export -> samples, with the OTLP partial-success answer.

The decoding and GenAI mapping live in otlp.py and genai_spans.py and run where otlp_workers.py
decides (a pool process for a large export); this module hands one request's samples to the
capture pipeline and words the answer.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.ingest.genai_spans import summarize_rejections
from services.ingest.otlp import (
    OtlpDecodeError,
    OtlpTooLargeError,
    OtlpUnsupportedError,
    encode_response,
    encode_status,
    media_type,
)
from services.ingest.otlp_workers import ExportMapper, MapperUnavailable
from services.ingest.pipeline import CapturePipeline

# google.rpc.Code values of the failure answers. OTLP clients go by the HTTP status (429, 502,
# 503 and 504 are retried, every other failure is not); the code is for their logs.
INVALID_ARGUMENT = 3
RESOURCE_EXHAUSTED = 8
UNAVAILABLE = 14
UNAUTHENTICATED = 16
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

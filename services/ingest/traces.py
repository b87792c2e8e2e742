"""OTLP/HTTP trace export -> samples, with the OTLP partial-success answer.

The decoding and GenAI mapping live in otlp.py and genai_spans.py and run where otlp_workers.py
decides (a pool process for a large export); this module hands one request's samples to the
capture pipeline and words the answer.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.ingest.genai_spans import summarize_rejections
from services.ingest.otlp import encode_response, media_type
from services.ingest.otlp_workers import ExportMapper
from services.ingest.pipeline import CapturePipeline


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

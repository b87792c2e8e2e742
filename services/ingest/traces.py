"""OTLP/HTTP trace export -> samples, with the OTLP partial-success answer.

The decoding and GenAI mapping live in otlp.py and genai_spans.py; this module only runs them
for one request and hands the samples to the capture pipeline.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from services.ingest.genai_assembly import RejectedSpan
from services.ingest.genai_spans import spans_to_samples, summarize_rejections
from services.ingest.normalize import Dropped
from services.ingest.otlp import decode_export, encode_response, media_type
from services.ingest.pipeline import CapturePipeline
from shared.chat import Sample

# Below this size decoding runs on the event loop; above, in a thread so calls keep flowing.
_INLINE_BYTES = 256 * 1024


@dataclass
class ExportOutcome:
    body: bytes
    media_type: str
    samples: int
    rejected: int


async def export_traces(
    pipeline: CapturePipeline,
    *,
    body: bytes,
    content_type: str,
    content_encoding: str | None,
    tenant: str,
) -> ExportOutcome:
    """Raises OtlpDecodeError (and its subclasses) for a body that is not a valid export."""

    def decode_and_map() -> tuple[list[Sample], list[RejectedSpan], list[Dropped]]:
        result = spans_to_samples(
            decode_export(body, content_type, content_encoding), tenant=tenant
        )
        return result.samples, result.rejected, result.dropped

    if len(body) > _INLINE_BYTES:
        samples, rejected, dropped = await asyncio.to_thread(decode_and_map)
    else:
        samples, rejected, dropped = decode_and_map()
    for note in dropped:
        pipeline.fidelity.count_dropped(tenant, "otlp", note.reason)
    for span in rejected:
        pipeline.fidelity.count_rejected(tenant, "otlp", span.reason)
    await pipeline.deliver_many(samples)
    answer = encode_response(len(rejected), summarize_rejections(rejected), content_type)
    mime = "application/json" if media_type(content_type) == "json" else "application/x-protobuf"
    return ExportOutcome(answer, mime, len(samples), len(rejected))

"""OTLP spans -> canonical samples: the entry point of trace ingestion.

`spans_to_samples` groups decoded spans (`otlp.decode_export`) by trace, reads every GenAI span
whatever convention wrote it (`genai_calls`, `genai_conventions`, `genai_messages`) and
assembles each trace's conversation with its tool calls and results (`genai_assembly`, whose
docstring states the rule). Spans without GenAI content are ignored, not rejected. A GenAI span
whose content cannot be read is rejected with a reason naming the attribute, and the rest of its
trace still assembles; `summarize_rejections` words them for OTLP partial success.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from services.ingest.otlp.export import Span
from services.ingest.otlp.genai_assembly import RejectedSpan, TraceResult, assemble_trace
from services.ingest.otlp.genai_calls import ChatCall, ToolRun, read_span
from services.ingest.otlp.genai_parts import ContentError
from shared.tenancy import is_tenant_id

__all__ = [
    "ChatCall",
    "ContentError",
    "RejectedSpan",
    "ToolRun",
    "TraceResult",
    "read_span",
    "spans_to_samples",
    "summarize_rejections",
]


def spans_to_samples(spans: Iterable[Span], *, tenant: str) -> TraceResult:
    """Group spans by trace (first-seen order) and turn each trace's GenAI spans into samples.
    `tenant` comes from the caller's API key, never from span attributes."""
    if not is_tenant_id(tenant):
        raise ValueError(f"tenant: {tenant!r} is not a tenant id")
    traces: dict[str, list[Span]] = {}
    for span in spans:
        traces.setdefault(span.trace_id, []).append(span)
    result = TraceResult()
    for trace_spans in traces.values():
        assemble_trace(trace_spans, tenant, result)
    return result


def summarize_rejections(rejected: Sequence[RejectedSpan], *, limit: int = 5) -> str:
    """The `partial_success.error_message` for rejected spans: the first few reasons."""
    if not rejected:
        return ""
    shown = "; ".join(f"span {r.span_id}: {r.reason}" for r in rejected[:limit])
    more = f"; and {len(rejected) - limit} more" if len(rejected) > limit else ""
    return f"{len(rejected)} span(s) rejected: {shown}{more}"

"""What capture works on: a proxied call as bytes, and how it is read into an exchange.

The gateway journals each call it answered (journal.py); the shipper process reads the journal
and hands the calls to the capture pipeline (pipeline.py), which normalises, scrubs, moves media
and oversized samples to object storage and publishes `sample.captured`. Whatever cannot be
published now (NATS or S3 away) goes to the spill file (`SpillFile`, capped) and is replayed
when they return, so no accepted sample is lost across restarts either.
"""

from __future__ import annotations

import base64
import gzip
import logging
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson

from services.ingest.gateway.routing import Api
from services.ingest.normalize import Exchange, NormalizeError
from shared.bus import EncodedEvent
from shared.chat import derive_sample_id
from shared.events import SampleCaptured

log = logging.getLogger("tuneloop.ingest.capture")

Publish = Callable[[SampleCaptured], Awaitable[None]]
# Publishes encoded events together; each one's outcome in order, None when it was stored.
PublishMany = Callable[[list[EncodedEvent]], Awaitable[list[BaseException | None]]]


@dataclass
class CapturedCall:
    """One proxied call, as bytes, before any parsing (parsing is the workers' job)."""

    api: Api
    tenant: str
    request_id: str
    request_body: bytes
    status: int
    response_body: bytes  # as received from upstream, still content-encoded
    content_type: str
    content_encoding: str
    started_at: datetime
    latency_ms: float
    ttft_ms: float | None = None
    model_from_path: str | None = None
    tags: list[str] = field(default_factory=list)
    # The API path called (normalize.Exchange.api_path); "" in journal lines written before it.
    path: str = ""

    def to_record(self) -> dict[str, Any]:
        # Field by field, not dataclasses.asdict: that deep-copies every value, and this runs
        # for every proxied call (the journal line).
        return {
            "api": self.api,
            "tenant": self.tenant,
            "request_id": self.request_id,
            "request_body": base64.b64encode(self.request_body).decode(),
            "status": self.status,
            "response_body": base64.b64encode(self.response_body).decode(),
            "content_type": self.content_type,
            "content_encoding": self.content_encoding,
            "started_at": self.started_at.isoformat(),
            "latency_ms": self.latency_ms,
            "ttft_ms": self.ttft_ms,
            "model_from_path": self.model_from_path,
            "tags": self.tags,
            "path": self.path,
        }

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> CapturedCall:
        return cls(
            **{
                **record,
                "request_body": base64.b64decode(record["request_body"]),
                "response_body": base64.b64decode(record["response_body"]),
                "started_at": datetime.fromisoformat(record["started_at"]),
            }
        )


def gateway_sample_id(tenant: str, request_id: str) -> str:
    """The id of the sample a captured call becomes, known before the call is read: `Sample`
    derives it from (tenant, source, source_ref = the call's request id, choice index), so the
    gateway can tell the caller (`x-tuneloop-sample-id`) while the answer goes out. It is the
    first choice's; an OpenAI call with `n` > 1 makes one sample per choice."""
    return derive_sample_id(tenant, "gateway", request_id)


def decode_body(raw: bytes, encoding: str) -> bytes:
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return raw
    if encoding == "gzip":
        return gzip.decompress(raw)
    if encoding == "deflate":
        return zlib.decompress(raw)
    raise ValueError(f"content-encoding {encoding!r} is not supported for capture")


def to_exchange(call: CapturedCall) -> Exchange:
    """Parse the bytes of a call into an Exchange; NormalizeError names what is unreadable."""
    try:
        request = orjson.loads(call.request_body)
    except orjson.JSONDecodeError as exc:
        raise NormalizeError("request", f"body is not JSON ({exc})") from None
    if not isinstance(request, dict):
        raise NormalizeError("request", "body is not a JSON object")
    try:
        body = decode_body(call.response_body, call.content_encoding)
    except (ValueError, OSError, zlib.error) as exc:
        raise NormalizeError("response", str(exc)) from None
    text = body.decode("utf-8", "replace")
    if call.content_type.startswith("text/event-stream"):
        return _exchange(call, request, None, text)
    try:
        parsed = orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        parsed = None
    if isinstance(parsed, list) and call.api == "gemini":
        # streamGenerateContent without alt=sse answers one JSON array of chunks.
        return _exchange(call, request, None, text)
    return _exchange(
        call, request, parsed if isinstance(parsed, dict) else {"raw": text[:2000]}, None
    )


def _exchange(
    call: CapturedCall, request: dict[str, Any], response: dict[str, Any] | None, stream: str | None
) -> Exchange:
    return Exchange(
        provider=call.api,
        request=request,
        status=call.status,
        response=response,
        stream=stream,
        model_from_path=call.model_from_path,
        api_path=call.path or None,
        tenant=call.tenant,
        source="gateway",
        source_ref=call.request_id,
        created_at=call.started_at,
        latency_ms=call.latency_ms,
        time_to_first_token_ms=call.ttft_ms,
        tags=call.tags,
    )

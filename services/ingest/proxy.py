"""Forward one call to its upstream and stream the answer back byte for byte, tapping a copy.

The client's tuneloop key is removed and the provider key added; every other header and the
body go through unchanged. The response streams back as it arrives (SSE included) with the
upstream's status, headers and encoding, so an SDK cannot tell the gateway from the provider.
When the last byte has been sent, the tap hands the captured call to the capture pipeline.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime

import httpx
from starlette.requests import Request
from starlette.responses import StreamingResponse

from services.ingest.capture import CapturedCall
from services.ingest.routing import Api, Route

# Hop-by-hop headers (RFC 9110 7.6.1): they describe one connection, never the message.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
# Also the ones the gateway owns: the caller's credentials and how the body is framed and encoded.
_DROP_REQUEST = HOP_BY_HOP | {
    "host", "content-length", "proxy-authorization", "authorization", "x-api-key", "x-goog-api-key",
    "accept-encoding", "cookie",
}  # fmt: skip
_DROP_RESPONSE = HOP_BY_HOP
# Only encodings the capture can decode; the client still gets the upstream's bytes unchanged.
_ACCEPT_ENCODING = "gzip, deflate"


def upstream_headers(request: Request, route: Route) -> dict[str, str]:
    headers = {
        name: value
        for name, value in request.headers.items()
        if name not in _DROP_REQUEST and not name.startswith("x-tuneloop-")
    }
    headers["accept-encoding"] = _ACCEPT_ENCODING
    if route.api_key:
        if route.api == "anthropic":
            headers["x-api-key"] = route.api_key
        elif route.api == "gemini":
            headers["x-goog-api-key"] = route.api_key
        else:
            headers["authorization"] = f"Bearer {route.api_key}"
    return headers


def upstream_url(request: Request, route: Route, path: str) -> str:
    # Gemini clients may put their (tuneloop) key in ?key=; it must not travel upstream. The
    # rest of the query is kept as sent (Vertex uses `$alt=json;enum-encoding=int`).
    raw = request.url.query
    query = "&".join(item for item in raw.split("&") if item and not item.startswith("key="))
    return f"{route.base_url}{path}" + (f"?{query}" if query else "")


def parse_tags(request: Request) -> list[str]:
    raw = request.headers.get("x-tuneloop-tags", "")
    return [tag.strip() for tag in raw.split(",") if tag.strip()][:32]


async def forward(
    *,
    client: httpx.AsyncClient,
    request: Request,
    body: bytes,
    route: Route,
    api: Api,
    path: str,
    tenant: str,
    capture: Callable[[CapturedCall], None],
    model_from_path: str | None = None,
) -> StreamingResponse:
    """Send the call upstream; raises httpx.HTTPError when the upstream cannot be reached."""
    started_at = datetime.now(UTC)
    start = time.perf_counter()
    upstream_request = client.build_request(
        request.method,
        upstream_url(request, route, path),
        headers=upstream_headers(request, route),
        content=body,
    )
    upstream = await client.send(upstream_request, stream=True)
    chunks: list[bytes] = []
    first_byte: list[float] = []

    def captured() -> CapturedCall:
        return CapturedCall(
            api=api,
            tenant=tenant,
            request_id=uuid.uuid4().hex,
            request_body=body,
            status=upstream.status_code,
            response_body=b"".join(chunks),
            content_type=upstream.headers.get("content-type", ""),
            content_encoding=upstream.headers.get("content-encoding", ""),
            started_at=started_at,
            latency_ms=(time.perf_counter() - start) * 1000,
            ttft_ms=(first_byte[0] - start) * 1000 if first_byte else None,
            model_from_path=model_from_path,
            tags=parse_tags(request),
        )

    async def relay() -> AsyncIterator[bytes]:
        complete = False
        try:
            async for chunk in upstream.aiter_raw():
                if not first_byte:
                    first_byte.append(time.perf_counter())
                chunks.append(chunk)
                yield chunk
            complete = True
        finally:
            # Runs when the last byte is sent, and also when the client goes away mid-stream:
            # the upstream connection must go back to the pool either way. Only whole answers
            # are captured; a cut-off one would be a truncated training example.
            if complete:
                capture(captured())
            await upstream.aclose()

    headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _DROP_RESPONSE}
    return StreamingResponse(
        relay(),
        status_code=upstream.status_code,
        headers=headers,
    )

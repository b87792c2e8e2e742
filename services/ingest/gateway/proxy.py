"""Forward one call to its upstream and relay the answer back byte for byte, tapping a copy.

The client's tuneloop key is removed and the provider key added; every other header and the
body go through unchanged. The answer goes back with the upstream's status, headers and encoding
(nothing is decompressed: the client gets the upstream's bytes, gzip included): a sized JSON
answer in one ASGI message, a stream (SSE, chunked) chunk by chunk as it arrives, so an SDK
cannot tell the gateway from the provider. When the last byte has been sent, the tap hands the
captured call to the capture pipeline.

This is the gateway's hot path, so it speaks raw ASGI (no Starlette request/response objects)
and raw HTTP/1.1 upstream (services.ingest.gateway.upstream_pool).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import orjson
from starlette.types import Receive, Send

from services.ingest.capture.call import CapturedCall, gateway_sample_id
from services.ingest.gateway.routing import Api, Route
from services.ingest.gateway.upstream_pool import UpstreamError, UpstreamPool, UpstreamResponse

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
# Also the ones the gateway owns: the caller's credentials, how the body is framed and encoded
# (and `expect`: the gateway already holds the whole body).
_DROP_REQUEST = frozenset(
    name.encode()
    for name in HOP_BY_HOP
    | {
        "host", "content-length", "proxy-authorization", "authorization", "x-api-key",
        "x-goog-api-key", "accept-encoding", "cookie", "expect",
    }
)  # fmt: skip
# The id of the sample a captured call becomes (capture.gateway_sample_id), sent with its
# answer so the caller can give feedback on it (POST /v1/feedback). The gateway's own: an
# upstream's (another gateway in front of a provider) never goes through.
SAMPLE_ID_HEADER = b"x-tuneloop-sample-id"
_DROP_RESPONSE = frozenset(name.encode() for name in HOP_BY_HOP) | {SAMPLE_ID_HEADER}
# Encodings the capture can decode; the client still gets the upstream's bytes unchanged.
_DECODABLE = frozenset({b"gzip", b"x-gzip", b"deflate", b"identity"})
_ANY_DECODABLE = b"gzip, deflate"
_TUNELOOP_PREFIX = b"x-tuneloop-"
_TAGS = b"x-tuneloop-tags"

Headers = list[tuple[bytes, bytes]]  # ASGI's raw header list


class UpstreamUnreachable(Exception):
    """The upstream could not be reached or did not start answering in time (maps to 502).
    Its message is the short kind a caller may see; the cause has the detail."""


@dataclass
class Incoming:
    """What the gateway read of one call: method, raw path and query, headers, the whole body."""

    method: str
    raw_path: (
        str  # as sent (percent-encoded, checked: services.ingest.gateway.targets): sent upstream
    )
    query: str
    headers: Headers
    body: bytes = b""
    tags: list[str] = field(default_factory=list)


def upstream_headers(incoming: Incoming, route: Route) -> Headers:
    headers = [
        (name, value)
        for name, value in incoming.headers
        if name not in _DROP_REQUEST and not name.startswith(_TUNELOOP_PREFIX)
    ]
    accepted = next((v for k, v in incoming.headers if k == b"accept-encoding"), None)
    headers.append((b"accept-encoding", upstream_accept_encoding(accepted)))
    if route.api_key:
        headers.append(_key_header(route.api, route.api_key))
    return headers


def upstream_accept_encoding(accepted: bytes | None) -> bytes:
    """The Accept-Encoding to send upstream: the caller's choices among those the capture can
    decode (with their q-values), so the caller never gets an encoding it did not accept and the
    capture never one it cannot read. No header means any encoding will do (RFC 9110): gzip; a
    header that leaves nothing (`br` only) gets `identity`, which every server can answer."""
    if accepted is None:
        return _ANY_DECODABLE
    kept: list[bytes] = []
    for item in accepted.split(b","):
        coding, _, params = item.strip().partition(b";")
        coding = coding.strip().lower()
        if coding == b"*":
            suffix = b";" + params if params else b""
            kept += [b"gzip" + suffix, b"deflate" + suffix]
        elif coding in _DECODABLE:
            kept.append(item.strip())
    return b", ".join(kept) if kept else b"identity"


def _key_header(api: Api, key: str) -> tuple[bytes, bytes]:
    if "\r" in key or "\n" in key:  # it comes from the environment; never let it split a header
        raise ValueError(f"the {api} upstream key contains a line break")
    if api == "anthropic":
        return b"x-api-key", key.encode("latin-1")
    if api == "gemini":
        return b"x-goog-api-key", key.encode("latin-1")
    return b"authorization", b"Bearer " + key.encode("latin-1")


def upstream_target(incoming: Incoming) -> str:
    """Path and query for the upstream: the raw path as the client sent it (never the decoded
    one, whose `%0d%0a` would split the request line). Gemini clients may put their (tuneloop)
    key in ?key=; it must not travel upstream. The rest of the query is kept as sent (Vertex
    uses `$alt=json;enum-encoding=int`)."""
    path = incoming.raw_path
    if not incoming.query:
        return path
    query = "&".join(
        item for item in incoming.query.split("&") if item and not item.startswith("key=")
    )
    return f"{path}?{query}" if query else path


def parse_tags(headers: Headers) -> list[str]:
    raw = b",".join(value for name, value in headers if name == _TAGS).decode("latin-1")
    return [tag.strip() for tag in raw.split(",") if tag.strip()][:32]


@dataclass
class _Tap:
    """What the capture needs of an answer that is being relayed."""

    started_at: datetime
    start: float
    keep: bool = True  # False: nothing is captured, so a stream's chunks are not held
    chunks: list[bytes] = field(default_factory=list)
    first_byte: float | None = None

    def add(self, chunk: bytes) -> None:
        if self.first_byte is None:
            self.first_byte = time.perf_counter()
        if self.keep:
            self.chunks.append(chunk)


async def forward(
    *,
    client: UpstreamPool,
    incoming: Incoming,
    route: Route,
    api: Api,
    path: str,
    tenant: str,
    receive: Receive,
    send: Send,
    response_headers: Headers,
    capture: Callable[[CapturedCall], None] | None,
    model_from_path: str | None = None,
) -> int:
    """Relay the call and return the upstream's status; raises UpstreamUnreachable before
    anything was sent to the client.

    `path` is the API path the capture records; the upstream gets the client's raw path.
    `response_headers` are added to the upstream's (the gateway's own `x-tuneloop-served-by`).
    `capture` None: the call is relayed only (embeddings, token counts), its answer not kept;
    otherwise the answer also names the sample it becomes (`x-tuneloop-sample-id`).
    """
    tap = _Tap(datetime.now(UTC), time.perf_counter(), keep=capture is not None)
    # Decided now, not once the answer is in: a stream's headers go out before its end.
    request_id = os.urandom(16).hex() if capture is not None else ""
    try:
        upstream = await client.request(
            incoming.method,
            route.base_url,
            upstream_target(incoming),
            upstream_headers(incoming, route),
            routed_body(incoming.body, route),
        )
    except UpstreamError as exc:
        raise UpstreamUnreachable(exc.kind) from exc
    content_type = (upstream.header(b"content-type") or b"").decode("latin-1")

    def journal() -> None:
        """Capture the whole answer: called once it is all here, before its last bytes go out,
        so a gateway killed at any moment never leaves a client an answer it did not keep."""
        if capture is None:
            return
        capture(
            CapturedCall(
                api=api,
                tenant=tenant,
                request_id=request_id,
                request_body=incoming.body,
                status=upstream.status,
                response_body=b"".join(tap.chunks),
                content_type=content_type,
                content_encoding=(upstream.header(b"content-encoding") or b"").decode("latin-1"),
                started_at=tap.started_at,
                latency_ms=(time.perf_counter() - tap.start) * 1000,
                ttft_ms=(tap.first_byte - tap.start) * 1000 if tap.first_byte else None,
                model_from_path=model_from_path,
                tags=incoming.tags,
                path=path,
            )
        )

    try:
        headers = [(name, value) for name, value in upstream.headers if name not in _DROP_RESPONSE]
        headers += response_headers
        if capture is not None:
            headers.append((SAMPLE_ID_HEADER, gateway_sample_id(tenant, request_id).encode()))
        start = {"type": "http.response.start", "status": upstream.status, "headers": headers}
        # Only whole answers are captured; a cut-off one would be a truncated training example.
        if upstream.content_length is not None and not content_type.startswith("text/event-stream"):
            await _relay_whole(upstream, start, send, tap, journal)
        else:
            await _relay_stream(upstream, start, receive, send, tap, journal)
    finally:
        upstream.release()
    return upstream.status


def routed_body(body: bytes, route: Route) -> bytes:
    """The body sent upstream: a served name's call names the model its engine answers to (the
    version's ft: name) instead of the served name; the sample keeps what the caller sent."""
    if route.model is None:
        return body
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body  # the gateway read a model from it, so this does not happen
    if not isinstance(document, dict):
        return body
    document["model"] = route.model
    return orjson.dumps(document)


async def _relay_whole(
    upstream: UpstreamResponse,
    start: dict[str, object],
    send: Send,
    tap: _Tap,
    journal: Callable[[], None],
) -> None:
    """A sized answer: read it all, journal it, then send it in one message (two writes, no
    chunking)."""
    try:
        body = await upstream.read()
    except UpstreamError as exc:
        raise UpstreamUnreachable(exc.kind) from exc
    tap.add(body)
    journal()
    await send(start)
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _relay_stream(
    upstream: UpstreamResponse,
    start: dict[str, object],
    receive: Receive,
    send: Send,
    tap: _Tap,
    journal: Callable[[], None],
) -> None:
    """A stream: chunk by chunk as it arrives, journaled once the upstream has ended, before
    the end goes to the client. A client that goes away ends the relay (the upstream
    connection is then closed, not reused; nothing is journaled)."""
    await send(start)

    async def pump() -> None:
        while (chunk := await upstream.next_chunk()) is not None:
            tap.add(chunk)
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        journal()
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    relay = asyncio.ensure_future(pump())
    gone = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait((relay, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (relay, gone):
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
    if relay.cancelled():
        upstream.close()
        return
    relay.result()  # an upstream cut off mid-stream raises here: the client's connection is aborted


async def _disconnected(receive: Receive) -> None:
    # The body has been read: the next message the server has for this request is its end.
    while (await receive())["type"] != "http.disconnect":
        pass

"""Forward one call to its upstream and relay the answer back byte for byte, tapping a copy.

The client's tuneloop key is removed and the provider key added; every other header and the
body go through unchanged. The answer goes back with the upstream's status, headers and encoding
(aiohttp with `auto_decompress=False`: the client gets the upstream's bytes, gzip included): a
sized JSON answer in one ASGI message, a stream (SSE, chunked) chunk by chunk as it arrives, so
an SDK cannot tell the gateway from the provider. When the last byte has been sent, the tap hands
the captured call to the capture pipeline.

This is the gateway's hot path, so it speaks raw ASGI (no Starlette request/response objects) and
uses aiohttp's pooled client, whose C parser costs a fraction of httpx's per call.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import aiohttp
from starlette.types import Receive, Send
from yarl import URL

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
_DROP_REQUEST = frozenset(
    name.encode()
    for name in HOP_BY_HOP
    | {
        "host", "content-length", "proxy-authorization", "authorization", "x-api-key",
        "x-goog-api-key", "accept-encoding", "cookie",
    }
)  # fmt: skip
_DROP_RESPONSE = frozenset(name.encode() for name in HOP_BY_HOP)
# Only encodings the capture can decode; the client still gets the upstream's bytes unchanged.
_ACCEPT_ENCODING = "gzip, deflate"
_TUNELOOP_PREFIX = b"x-tuneloop-"
_TAGS = b"x-tuneloop-tags"

Headers = list[tuple[bytes, bytes]]  # ASGI's raw header list


class UpstreamUnreachable(Exception):
    """The upstream could not be reached or did not start answering in time (maps to 502)."""


@dataclass
class Incoming:
    """What the gateway read of one call: method, raw path and query, headers, the whole body."""

    method: str
    raw_path: str  # as sent (percent-encoded), for paths that carry a model name
    query: str
    headers: Headers
    body: bytes = b""
    tags: list[str] = field(default_factory=list)


def upstream_headers(incoming: Incoming, route: Route) -> list[tuple[str, str]]:
    headers = [
        (name.decode("latin-1"), value.decode("latin-1"))
        for name, value in incoming.headers
        if name not in _DROP_REQUEST and not name.startswith(_TUNELOOP_PREFIX)
    ]
    headers.append(("accept-encoding", _ACCEPT_ENCODING))
    if route.api_key:
        if route.api == "anthropic":
            headers.append(("x-api-key", route.api_key))
        elif route.api == "gemini":
            headers.append(("x-goog-api-key", route.api_key))
        else:
            headers.append(("authorization", f"Bearer {route.api_key}"))
    return headers


def upstream_url(incoming: Incoming, route: Route, path: str) -> URL:
    # Gemini clients may put their (tuneloop) key in ?key=; it must not travel upstream. The
    # rest of the query is kept as sent (Vertex uses `$alt=json;enum-encoding=int`).
    query = "&".join(
        item for item in incoming.query.split("&") if item and not item.startswith("key=")
    )
    return URL(f"{route.base_url}{path}" + (f"?{query}" if query else ""), encoded=True)


def parse_tags(headers: Headers) -> list[str]:
    raw = b",".join(value for name, value in headers if name == _TAGS).decode("latin-1")
    return [tag.strip() for tag in raw.split(",") if tag.strip()][:32]


class UpstreamClient:
    """One pooled aiohttp session for every upstream; opened on first use (inside the loop)."""

    def __init__(
        self, *, connect_timeout_s: float, read_timeout_s: float, max_connections: int
    ) -> None:
        # No total limit: a long generation streams for as long as it takes, but each read
        # (the gap between chunks) is bounded.
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=connect_timeout_s, sock_read=read_timeout_s
        )
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._max_connections, limit_per_host=0),
                timeout=self._timeout,
                auto_decompress=False,  # byte-exact pass-through; capture decodes its own copy
                skip_auto_headers=("User-Agent",),  # the caller's own user-agent goes through
                # One session serves every tenant: cookies an upstream sets (OpenAI's Cloudflare
                # ones) go back to the caller untouched and are never sent on anyone's next call.
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


@dataclass
class _Tap:
    """What the capture needs of an answer that is being relayed."""

    started_at: datetime
    start: float
    chunks: list[bytes] = field(default_factory=list)
    first_byte: float | None = None

    def add(self, chunk: bytes) -> None:
        if self.first_byte is None:
            self.first_byte = time.perf_counter()
        self.chunks.append(chunk)


async def forward(
    *,
    client: UpstreamClient,
    incoming: Incoming,
    route: Route,
    api: Api,
    path: str,
    tenant: str,
    receive: Receive,
    send: Send,
    response_headers: Headers,
    capture: Callable[[CapturedCall], None],
    model_from_path: str | None = None,
) -> None:
    """Relay the call; raises UpstreamUnreachable before anything was sent to the client.

    `response_headers` are added to the upstream's (the gateway's own `x-tuneloop-served-by`).
    """
    tap = _Tap(datetime.now(UTC), time.perf_counter())
    try:
        upstream = await client.session().request(
            incoming.method,
            upstream_url(incoming, route, path),
            headers=upstream_headers(incoming, route),
            data=incoming.body,
            allow_redirects=False,
        )
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise UpstreamUnreachable(f"{type(exc).__name__}: {exc}") from exc
    try:
        headers = [
            (name.lower(), value)
            for name, value in upstream.raw_headers
            if name.lower() not in _DROP_RESPONSE
        ]
        headers += response_headers
        start = {"type": "http.response.start", "status": upstream.status, "headers": headers}
        content_type = upstream.headers.get("content-type", "")
        if upstream.content_length is not None and not content_type.startswith("text/event-stream"):
            complete = await _relay_whole(upstream, start, send, tap)
        else:
            complete = await _relay_stream(upstream, start, receive, send, tap)
    finally:
        upstream.release()
    # Only whole answers are captured; a cut-off one would be a truncated training example.
    if complete:
        capture(
            CapturedCall(
                api=api,
                tenant=tenant,
                request_id=os.urandom(16).hex(),
                request_body=incoming.body,
                status=upstream.status,
                response_body=b"".join(tap.chunks),
                content_type=content_type,
                content_encoding=upstream.headers.get("content-encoding", ""),
                started_at=tap.started_at,
                latency_ms=(time.perf_counter() - tap.start) * 1000,
                ttft_ms=(tap.first_byte - tap.start) * 1000 if tap.first_byte else None,
                model_from_path=model_from_path,
                tags=incoming.tags,
            )
        )


async def _relay_whole(
    upstream: aiohttp.ClientResponse, start: dict[str, object], send: Send, tap: _Tap
) -> bool:
    """A sized answer: read it all, then send it in one message (two writes, no chunking)."""
    try:
        body = await upstream.read()
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise UpstreamUnreachable(f"{type(exc).__name__}: {exc}") from exc
    tap.add(body)
    await send(start)
    await send({"type": "http.response.body", "body": body, "more_body": False})
    return True


async def _relay_stream(
    upstream: aiohttp.ClientResponse,
    start: dict[str, object],
    receive: Receive,
    send: Send,
    tap: _Tap,
) -> bool:
    """A stream: chunk by chunk as it arrives. A client that goes away ends the relay (the
    upstream connection is then closed, not reused); returns whether the whole answer went out."""
    await send(start)

    async def pump() -> None:
        async for chunk in upstream.content.iter_any():
            tap.add(chunk)
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
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
        return False
    relay.result()  # an upstream cut off mid-stream raises here: the client's connection is aborted
    return True


async def _disconnected(receive: Receive) -> None:
    # The body has been read: the next message the server has for this request is its end.
    while (await receive())["type"] != "http.disconnect":
        pass

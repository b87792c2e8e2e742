"""The gateway's upstream hop: pooled keep-alive HTTP/1.1 connections, answers parsed by httptools.

The proxy needs little of an HTTP client: send one request with its whole body, get the answer's
status and raw headers, then its body (sized, chunked or until the connection closes) chunk by
chunk as it arrives, with nothing decoded, no redirects and no cookies. aiohttp's client did that
for ~130 µs of CPU per call, a third of everything the gateway spent on one; this module writes
the request in one buffer and hands the parser's callbacks straight to the waiting relay, for a
fraction of that. The parser is llhttp (httptools, as uvicorn uses), so the HTTP itself is not
hand-parsed here.

What a caller can rely on:
- `request` raises `UpstreamError` when no answer head arrives: connect failure or timeout
  (`connect_timeout_s`), the connection broken, an unparsable answer, or no byte for
  `read_timeout_s`. Nothing is retried: these are POSTs that cost the caller money.
- `next_chunk` raises `UpstreamError` when the body is cut off or goes silent for
  `read_timeout_s`; it returns None at the end of the answer.
- At most `max_connections` calls hold a connection at once; more wait for one.
- A connection goes back to the pool only after a complete answer that allows keep-alive, and
  is not reused once idle for `idle_s` (servers drop idle connections, uvicorn and Node after
  5 s; a request written into one being closed would be lost).
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

import httptools

Headers = list[tuple[bytes, bytes]]
_HIGH_WATER = 256 * 1024  # unread answer bytes held before the connection stops reading


class UpstreamError(Exception):
    """The upstream could not be reached, broke the connection, or went silent for too long.

    `kind` is short and safe to show a caller ("connect failed", "timeout", ...); the message
    has the detail (addresses, OS errors) for the log."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind


@dataclass(frozen=True)
class Origin:
    """Where connections go: scheme, host, port, and the Host header they carry."""

    scheme: str
    host: str
    port: int
    host_header: bytes


def split_base_url(base_url: str) -> tuple[Origin, bytes]:
    """An upstream's base URL as (origin, path prefix), e.g. https://h/v1 -> (https h 443, b"/v1")."""
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"upstream base URL {base_url!r}: must be http(s)://host[:port][/prefix]")
    default = 443 if parts.scheme == "https" else 80
    port = parts.port or default
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname  # IPv6 literal
    host_header = (host if port == default else f"{host}:{port}").encode("idna")
    return Origin(parts.scheme, parts.hostname, port, host_header), parts.path.rstrip("/").encode()


class UpstreamResponse:
    """One answer as it arrives. `release()` (or `close()`) it when done, always."""

    def __init__(self, connection: _Connection, read_timeout_s: float) -> None:
        self._connection = connection
        self._read_timeout_s = read_timeout_s
        self.status = 0
        self.headers: Headers = []  # names lower-cased, values as sent, repeats kept
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._headers_done = False
        self._done = False
        self._keep_alive = False
        self._error: UpstreamError | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._finished = False

    def header(self, name: bytes) -> bytes | None:
        """The first value of a header (name lower-case), or None."""
        for key, value in self.headers:
            if key == name:
                return value
        return None

    @property
    def content_length(self) -> int | None:
        value = self.header(b"content-length")
        return int(value) if value is not None and value.isdigit() else None

    async def read(self) -> bytes:
        """The whole body."""
        parts = []
        while (chunk := await self.next_chunk()) is not None:
            parts.append(chunk)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def next_chunk(self) -> bytes | None:
        """The body bytes that arrived since the last call (waiting for some), None at the end."""
        while not self._chunks:
            if self._done:
                return None
            await self._wait()
        chunk = self._chunks.popleft()
        self._buffered -= len(chunk)
        if self._buffered < _HIGH_WATER:
            self._connection.resume_reading()
        return chunk

    def release(self) -> None:
        """Done with this answer: the connection is pooled again if it can be, else closed."""
        if self._finished:
            return
        self._finished = True
        reusable = self._done and self._keep_alive and self._error is None
        self._connection.finished(reusable=reusable)

    def close(self) -> None:
        """Done with this answer, and the connection is not to be reused (e.g. a client left)."""
        self._keep_alive = False
        self.release()

    async def wait_head(self) -> None:
        while not self._headers_done:
            await self._wait()

    async def _wait(self) -> None:
        if self._error is not None:
            raise self._error
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = loop.call_later(self._read_timeout_s, self._time_out, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None
        if self._error is not None:
            raise self._error

    def _time_out(self, waiter: asyncio.Future[None]) -> None:
        if not waiter.done():
            self.fail(UpstreamError("timeout", f"no data for {self._read_timeout_s:g} s"))

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    # Called by the connection as the parser reads the answer.
    def head_complete(self, status: int) -> None:
        self.status = status
        self._headers_done = True
        self._wake()

    def body(self, data: bytes) -> None:
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered >= _HIGH_WATER:
            self._connection.pause_reading()
        self._wake()

    def complete(self, keep_alive: bool) -> None:
        self._done = True
        self._keep_alive = keep_alive
        self._wake()

    def fail(self, error: UpstreamError) -> None:
        if self._done or self._error is not None:
            return
        self._error = error
        self._connection.abort()
        self._wake()

    def connection_closed(self) -> None:
        """The upstream closed the connection: the end of an until-close body, else a cut."""
        if self._done:
            return
        until_close = (
            self._headers_done
            and self.content_length is None
            and b"chunked" not in (self.header(b"transfer-encoding") or b"").lower()
        )
        if until_close:
            self.complete(keep_alive=False)
        elif self._headers_done:
            self.fail(UpstreamError("connection closed", "mid-answer"))
        else:
            self.fail(UpstreamError("connection closed", "before the answer's head"))


class _Connection(asyncio.Protocol):
    """One upstream connection; the parser's callbacks go to the answer being read."""

    def __init__(self, pool: UpstreamPool, origin: Origin) -> None:
        self.pool = pool
        self.origin = origin
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.response: UpstreamResponse | None = None
        self.idle_since = 0.0
        self.reading_paused = False
        self.informational = False  # reading a 1xx answer, which the real one follows

    @property
    def usable(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()

    def send(self, request: bytes, read_timeout_s: float) -> UpstreamResponse:
        assert self.transport is not None
        self.response = UpstreamResponse(self, read_timeout_s)
        self.transport.write(request)
        return self.response

    def finished(self, *, reusable: bool) -> None:
        self.response = None
        if reusable and self.usable:
            self.resume_reading()
            self.pool.put_back(self)
        else:
            self.abort()
            self.pool.slot_freed()

    def pause_reading(self) -> None:
        if not self.reading_paused and self.usable:
            self.reading_paused = True
            cast(asyncio.Transport, self.transport).pause_reading()

    def resume_reading(self) -> None:
        if self.reading_paused and self.usable:
            self.reading_paused = False
            cast(asyncio.Transport, self.transport).resume_reading()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()
            self.transport = None

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        if self.response is None:  # bytes nobody asked for: this connection cannot be trusted
            self.abort()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.response.fail(UpstreamError("invalid answer", f"not valid HTTP: {exc}"))

    def eof_received(self) -> bool:
        return False  # close our side too; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.response is not None:
            self.response.connection_closed()

    # httptools callbacks (names are its interface)
    def on_header(self, name: bytes, value: bytes) -> None:
        assert self.response is not None
        self.response.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        assert self.response is not None
        status = self.parser.get_status_code()
        if 100 <= status < 200:  # e.g. 100 Continue: not the answer, which comes next
            self.informational = True
            self.response.headers.clear()
            return
        self.response.head_complete(status)

    def on_body(self, body: bytes) -> None:
        assert self.response is not None
        self.response.body(body)

    def on_message_complete(self) -> None:
        assert self.response is not None
        if self.informational:
            self.informational = False
            return
        self.response.complete(self.parser.should_keep_alive())


class UpstreamPool:
    """Keep-alive connections to every upstream, shared by every tenant: nothing of one call's
    answer (a cookie, say) is kept for the next; opened on first use, inside the loop."""

    def __init__(
        self,
        *,
        connect_timeout_s: float,
        read_timeout_s: float,
        max_connections: int,
        idle_s: float,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.idle_s = idle_s
        self._ssl_context = ssl_context
        self._slots = asyncio.Semaphore(max_connections)
        self._idle: dict[Origin, list[_Connection]] = {}
        self._bases: dict[str, tuple[Origin, bytes]] = {}

    async def request(
        self, method: str, base_url: str, target: str, headers: Headers, body: bytes
    ) -> UpstreamResponse:
        """Send `method base_url+target` (target: path and query, encoded) and wait for the
        answer's head. `headers` go as given; Host and Content-Length are added here."""
        origin, prefix = self._base(base_url)
        await self._slots.acquire()
        try:
            connection = self._pooled(origin) or await self._connect(origin)
        except BaseException:
            self._slots.release()
            raise
        response = connection.send(
            _request_bytes(method, prefix + target.encode(), origin, headers, body),
            self.read_timeout_s,
        )
        try:
            await response.wait_head()
        except BaseException:
            response.close()
            raise
        return response

    def put_back(self, connection: _Connection) -> None:
        connection.idle_since = time.monotonic()
        self._idle.setdefault(connection.origin, []).append(connection)
        self._slots.release()

    def slot_freed(self) -> None:
        self._slots.release()

    async def aclose(self) -> None:
        for connections in self._idle.values():
            for connection in connections:
                connection.abort()
        self._idle.clear()

    def _base(self, base_url: str) -> tuple[Origin, bytes]:
        base = self._bases.get(base_url)
        if base is None:
            base = self._bases[base_url] = split_base_url(base_url)
        return base

    def _pooled(self, origin: Origin) -> _Connection | None:
        idle = self._idle.get(origin)
        oldest_usable = time.monotonic() - self.idle_s
        while idle:
            connection = idle.pop()  # the most recently used: the likeliest still open
            if connection.usable and connection.idle_since >= oldest_usable:
                return connection
            connection.abort()
        return None

    async def _connect(self, origin: Origin) -> _Connection:
        loop = asyncio.get_running_loop()
        tls = None
        if origin.scheme == "https":
            if self._ssl_context is None:
                self._ssl_context = ssl.create_default_context()
            tls = self._ssl_context
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, connection = await loop.create_connection(
                    lambda: _Connection(self, origin),
                    origin.host,
                    origin.port,
                    ssl=tls,
                    server_hostname=origin.host if tls else None,
                )
        except TimeoutError as exc:
            raise UpstreamError(
                "connect timeout",
                f"{origin.host}:{origin.port} took over {self.connect_timeout_s:g} s",
            ) from exc
        except OSError as exc:
            raise UpstreamError("connect failed", f"{origin.host}:{origin.port}: {exc}") from exc
        return connection


def _request_bytes(
    method: str, target: bytes, origin: Origin, headers: Headers, body: bytes
) -> bytes:
    lines = [method.encode(), b" ", target or b"/", b" HTTP/1.1\r\nhost: ", origin.host_header]
    for name, value in headers:
        lines += (b"\r\n", name, b": ", value)
    lines += (b"\r\ncontent-length: ", str(len(body)).encode(), b"\r\n\r\n", body)
    return b"".join(lines)

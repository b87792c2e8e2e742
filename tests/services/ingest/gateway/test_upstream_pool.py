"""The gateway's upstream connection pool against a raw asyncio server whose every byte the test
scripts: keep-alive reuse, the three ways a body is framed, cut-offs, silence, limits, TLS."""

from __future__ import annotations

import asyncio
import datetime
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import uvicorn
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from sqlalchemy import create_engine

from services.ingest.config import IngestSettings
from services.ingest.gateway.calls import Gateway
from services.ingest.gateway.routing import RoutingTable
from services.ingest.gateway.upstream_pool import UpstreamError, UpstreamPool, split_base_url
from shared.auth import CachedAuthenticator

JSON = b'{"ok":true}'
SIZED = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n" + JSON

# One scripted connection: given what the server read so far, write/close as the test wants.
Script = Callable[["Connection"], Awaitable[None]]
Serve = Callable[..., Awaitable["Server"]]


@dataclass
class Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    async def request(self) -> bytes:
        """One whole request (head + content-length body) as received."""
        head = await self.reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        return head + await self.reader.readexactly(length)

    async def answer(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()


@dataclass
class Server:
    base_url: str
    connections: int = 0
    open_now: int = 0
    most_open: int = 0
    requests: list[bytes] = field(default_factory=list)


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    servers: list[asyncio.Server] = []

    async def start(script: Script, tls: ssl.SSLContext | None = None) -> Server:
        state = Server("")

        async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            state.connections += 1
            state.open_now += 1
            state.most_open = max(state.most_open, state.open_now)
            try:
                await script(Connection(reader, writer))
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            finally:
                state.open_now -= 1
                writer.close()

        server = await asyncio.start_server(on_connection, "127.0.0.1", 0, ssl=tls)
        servers.append(server)
        port = server.sockets[0].getsockname()[1]
        state.base_url = f"{'https' if tls else 'http'}://localhost:{port}/prefix"
        return state

    yield start
    for server in servers:
        server.close()
        await server.wait_closed()


def pool(**overrides: float) -> UpstreamPool:
    options: dict[str, float] = {"connect_timeout_s": 5, "read_timeout_s": 5, "max_connections": 8}
    options.update(overrides)
    return UpstreamPool(
        connect_timeout_s=options["connect_timeout_s"],
        read_timeout_s=options["read_timeout_s"],
        max_connections=int(options["max_connections"]),
        idle_s=options.get("idle_s", 4.0),
    )


def keep_answering(answer: bytes, seen: list[bytes] | None = None) -> Script:
    async def script(connection: Connection) -> None:
        while True:
            request = await connection.request()
            if seen is not None:
                seen.append(request)
            await connection.answer(answer)

    return script


async def call(upstreams: UpstreamPool, server: Server, body: bytes = b"{}") -> tuple[int, bytes]:
    answer = await upstreams.request(
        "POST", server.base_url, "/v1/chat/completions?x=1", [(b"x-test", b"yes")], body
    )
    try:
        return answer.status, await answer.read()
    finally:
        answer.release()


async def test_requests_go_as_given_and_reuse_one_kept_alive_connection(serve: Serve) -> None:
    seen: list[bytes] = []
    server = await serve(keep_answering(SIZED, seen))
    upstreams = pool()
    try:
        for _ in range(3):
            assert await call(upstreams, server, b'{"a":1}') == (200, JSON)
    finally:
        await upstreams.aclose()
    assert server.connections == 1
    port = server.base_url.split(":")[2].split("/")[0]
    assert seen[0] == (
        b"POST /prefix/v1/chat/completions?x=1 HTTP/1.1\r\nhost: localhost:"
        + port.encode()
        + b'\r\nx-test: yes\r\ncontent-length: 7\r\n\r\n{"a":1}'
    )


async def test_chunked_answers_arrive_chunk_by_chunk_and_until_close_ones_end_at_close(
    serve: Serve,
) -> None:
    release_last = asyncio.Event()

    async def chunked(connection: Connection) -> None:
        await connection.request()
        await connection.answer(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n6\r\ndata: \r\n"
        )
        await release_last.wait()
        await connection.answer(b"3\r\none\r\n0\r\n\r\n")

    upstreams = pool()
    server = await serve(chunked)
    answer = await upstreams.request("POST", server.base_url, "/s", [], b"")
    assert (answer.status, answer.header(b"content-type")) == (200, b"text/event-stream")
    assert await answer.next_chunk() == b"data: "  # before the rest was even sent
    release_last.set()
    assert await answer.next_chunk() == b"one"
    assert await answer.next_chunk() is None
    answer.release()

    async def until_close(connection: Connection) -> None:
        await connection.request()
        await connection.answer(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\npart one, ")
        await connection.answer(b"part two")
        connection.writer.close()

    server = await serve(until_close)
    assert await call(upstreams, server) == (200, b"part one, part two")
    assert await call(upstreams, server) == (200, b"part one, part two")
    assert server.connections == 2  # `connection: close` answers are never reused
    await upstreams.aclose()


async def test_an_answer_cut_off_is_an_error_not_a_short_body(serve: Serve) -> None:
    async def cut(connection: Connection) -> None:
        await connection.request()
        await connection.answer(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly this")
        connection.writer.transport.abort()

    async def nothing(connection: Connection) -> None:
        await connection.request()
        connection.writer.close()

    upstreams = pool()
    answer = await upstreams.request("POST", (await serve(cut)).base_url, "/", [], b"")
    with pytest.raises(UpstreamError) as cut_off:
        await answer.read()
    assert cut_off.value.kind == "connection closed"
    answer.release()
    with pytest.raises(UpstreamError) as unanswered:
        await upstreams.request("POST", (await serve(nothing)).base_url, "/", [], b"")
    assert unanswered.value.kind == "connection closed"
    await upstreams.aclose()


async def test_silence_longer_than_the_read_timeout_is_an_error(serve: Serve) -> None:
    async def head_then_silence(connection: Connection) -> None:
        await connection.request()
        await connection.answer(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        await asyncio.sleep(30)

    async def silence(connection: Connection) -> None:
        await connection.request()
        await asyncio.sleep(30)

    upstreams = pool(read_timeout_s=0.2)
    answer = await upstreams.request(
        "POST", (await serve(head_then_silence)).base_url, "/", [], b""
    )
    with pytest.raises(UpstreamError) as mid_answer:
        await answer.next_chunk()
    assert mid_answer.value.kind == "timeout"
    answer.release()
    with pytest.raises(UpstreamError) as before_head:
        await upstreams.request("POST", (await serve(silence)).base_url, "/", [], b"")
    assert before_head.value.kind == "timeout"
    await upstreams.aclose()


async def test_unreachable_upstream_and_invalid_answers_are_named(serve: Serve) -> None:
    async def garbage(connection: Connection) -> None:
        await connection.request()
        await connection.answer(b"SMTP ready\r\n\r\n")

    upstreams = pool()
    closed = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = closed.sockets[0].getsockname()[1]
    closed.close()
    await closed.wait_closed()
    with pytest.raises(UpstreamError) as refused:
        await upstreams.request("POST", f"http://127.0.0.1:{port}", "/", [], b"")
    assert refused.value.kind == "connect failed"
    with pytest.raises(UpstreamError) as invalid:
        await upstreams.request("POST", (await serve(garbage)).base_url, "/", [], b"")
    assert invalid.value.kind == "invalid answer"
    await upstreams.aclose()


async def test_a_100_continue_is_skipped_for_the_answer_that_follows(serve: Serve) -> None:
    async def continue_first(connection: Connection) -> None:
        await connection.request()
        await connection.answer(b"HTTP/1.1 100 Continue\r\n\r\n" + SIZED)

    upstreams = pool()
    assert await call(upstreams, await serve(continue_first)) == (200, JSON)
    await upstreams.aclose()


async def test_max_connections_bounds_calls_in_flight_and_the_rest_wait(serve: Serve) -> None:
    async def slow(connection: Connection) -> None:
        while True:
            await connection.request()
            await asyncio.sleep(0.05)
            await connection.answer(SIZED)

    server = await serve(slow)
    upstreams = pool(max_connections=2)
    answers = await asyncio.gather(*(call(upstreams, server) for _ in range(6)))
    await upstreams.aclose()
    assert answers == [(200, JSON)] * 6
    assert server.most_open == 2
    assert server.connections == 2


async def test_an_idle_connection_is_not_reused_after_idle_s(serve: Serve) -> None:
    server = await serve(keep_answering(SIZED))
    upstreams = pool(idle_s=0.1)
    assert await call(upstreams, server) == (200, JSON)
    await asyncio.sleep(0.2)
    assert await call(upstreams, server) == (200, JSON)
    await upstreams.aclose()
    assert server.connections == 2


def test_idle_connections_are_given_up_before_uvicorn_closes_them() -> None:
    # uvicorn serves vLLM (so our own deployments) and the tests' fake upstream. A connection it
    # closes for idleness just as the next request goes out loses that request as a 502
    # (`connection closed`): a make test run hit it when the pool kept connections for 15 s.
    keep_alive = uvicorn.Config(app=None).timeout_keep_alive
    assert IngestSettings().upstream_idle_s < keep_alive


def test_the_gateway_pools_upstream_connections_as_configured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TUNELOOP_INGEST_UPSTREAM_IDLE_S", "2.5")
    gateway = Gateway(
        settings=IngestSettings(),
        routes=RoutingTable(upstreams=[]),
        authenticator=CachedAuthenticator(create_engine("sqlite://")),
        capture=lambda call: None,
    )
    assert gateway.client.idle_s == 2.5


async def test_a_connection_the_upstream_closed_while_idle_is_not_reused(serve: Serve) -> None:
    async def one_then_close(connection: Connection) -> None:
        await connection.request()
        await connection.answer(SIZED)  # says nothing of closing, then closes
        connection.writer.close()

    server = await serve(one_then_close)
    upstreams = pool()
    assert await call(upstreams, server) == (200, JSON)
    await asyncio.sleep(0.05)  # the close arrives while the connection is pooled
    assert await call(upstreams, server) == (200, JSON)
    await upstreams.aclose()
    assert server.connections == 2


async def test_https_upstreams_are_verified_and_sent_the_host_name(
    serve: Serve, tmp_path: Path
) -> None:
    authority, certificate, key = _self_signed("localhost", tmp_path)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(certificate, key)
    server = await serve(keep_answering(SIZED), tls=tls)
    trusting = UpstreamPool(
        connect_timeout_s=5,
        read_timeout_s=5,
        max_connections=2,
        idle_s=4,
        ssl_context=ssl.create_default_context(cafile=str(authority)),
    )
    assert await call(trusting, server) == (200, JSON)
    await trusting.aclose()
    untrusting = pool()  # the system's roots: a self-signed certificate must be refused
    with pytest.raises(UpstreamError) as refused:
        await call(untrusting, server)
    assert refused.value.kind == "connect failed"
    await untrusting.aclose()


def test_base_urls_split_into_origin_and_prefix() -> None:
    origin, prefix = split_base_url("https://api.openai.com/v1/")
    assert (origin.host, origin.port, origin.host_header, prefix) == (
        "api.openai.com", 443, b"api.openai.com", b"/v1",
    )  # fmt: skip
    origin, prefix = split_base_url("http://[::1]:8080")
    assert (origin.host, origin.port, origin.host_header, prefix) == (
        "::1",
        8080,
        b"[::1]:8080",
        b"",
    )
    with pytest.raises(ValueError, match="must be http"):
        split_base_url("ftp://example.com")


def _self_signed(host: str, directory: Path) -> tuple[Path, Path, Path]:
    """A certificate for `host` signed by itself: (CA file, certificate file, key file)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = directory / "cert.pem", directory / "key.pem"
    cert_file.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_file, cert_file, key_file

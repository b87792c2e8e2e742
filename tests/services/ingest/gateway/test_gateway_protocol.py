"""GatewayProtocol: proxied calls skip the app's middleware and go out in one send; every other
request, and a pipelined one, takes uvicorn's usual path. Driven byte by byte through a
transport that records every write, as uvicorn's own protocol tests do."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import FastAPI
from starlette.types import Receive, Scope, Send
from uvicorn.config import Config
from uvicorn.server import ServerState

from services.ingest.gateway.fastpath import ProxyEndpoints
from services.ingest.gateway.protocol import GatewayProtocol

ANSWER = b'{"id":"chatcmpl-1"}'


class Recorded:
    """The transport side of one connection: every write as made, and whether it closed."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(
            name, default
        )

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def set_protocol(self, protocol: object) -> None: ...


class Scripted(ProxyEndpoints):
    """Proxy endpoints that answer every call themselves: sized, or streamed in two chunks."""

    def __init__(self) -> None:  # no gateway: nothing is proxied here
        self.paths: list[str] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.paths.append(scope["path"])
        while (await receive()).get("more_body"):
            pass
        if scope["query_string"] == b"alt=sse":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            for part in (b"data: 1\n\n", b"data: 2\n\n"):
                await send({"type": "http.response.body", "body": part, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        headers = [(b"content-type", b"application/json"), (b"content-length", b"19")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": ANSWER})


def serving() -> tuple[GatewayProtocol, Recorded, Scripted, list[str]]:
    app = FastAPI()
    through_app: list[str] = []

    @app.middleware("http")
    async def note(request: Any, call_next: Any) -> Any:
        through_app.append(request.url.path)
        return await call_next(request)

    @app.get("/healthz")
    async def healthz() -> dict[str, bool]:
        return {"ok": True}

    endpoints = Scripted()
    app.state.proxy_endpoints = endpoints
    config = Config(app=app, http=GatewayProtocol, proxy_headers=True, log_config=None)
    protocol = GatewayProtocol(config, ServerState(), app_state={})
    transport = Recorded()
    protocol.connection_made(transport)  # type: ignore[arg-type]
    return protocol, transport, endpoints, through_app


def post(path: str, *, close: bool = False) -> bytes:
    connection = b"connection: close\r\n" if close else b""
    return (
        f"POST {path} HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n".encode()
        + connection
        + b"content-length: 2\r\n\r\n{}"
    )


async def answered(transport: Recorded, count: int) -> bytes:
    for _ in range(200):
        if b"".join(transport.writes).count(b"HTTP/1.1 ") >= count:
            await asyncio.sleep(0.01)  # anything still to be written for the last answer
            return b"".join(transport.writes)
        await asyncio.sleep(0.005)
    raise AssertionError(f"no {count} answers; written: {transport.writes!r}")


async def test_a_proxied_call_skips_the_middleware_and_goes_out_in_one_send() -> None:
    protocol, transport, endpoints, through_app = serving()
    protocol.data_received(post("/v1/chat/completions"))
    await answered(transport, 1)
    assert endpoints.paths == ["/v1/chat/completions"]
    assert through_app == []
    assert len(transport.writes) == 1
    head, _, body = transport.writes[0].partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"content-length: 19" in head
    assert body == ANSWER
    assert not transport.closed


async def test_a_streamed_answer_is_chunked_with_its_head_in_the_first_send() -> None:
    protocol, transport, endpoints, _ = serving()
    protocol.data_received(post("/v1beta/models/gemini-2.0-flash:streamGenerateContent?alt=sse"))
    await answered(transport, 1)
    assert endpoints.paths == ["/v1beta/models/gemini-2.0-flash:streamGenerateContent"]
    first, *rest = transport.writes
    assert b"transfer-encoding: chunked\r\n\r\n9\r\ndata: 1\n\n\r\n" in first
    assert b"".join(rest) == b"9\r\ndata: 2\n\n\r\n0\r\n\r\n"


async def test_other_requests_and_pipelined_calls_take_uvicorns_usual_path() -> None:
    protocol, transport, endpoints, through_app = serving()
    protocol.data_received(b"GET /healthz HTTP/1.1\r\nhost: gw\r\n\r\n")
    assert b'{"ok":true}' in await answered(transport, 1)
    assert through_app == ["/healthz"]
    # Two calls in one read: the second arrives while the first is answered, so uvicorn
    # queues it and the app's own middleware (ProxyRoutes in the real app) serves it.
    protocol.data_received(post("/v1/messages") + post("/v1/messages"))
    written = await answered(transport, 3)
    # The first from the endpoints; the second from the app, which here has no such route.
    assert written.count(ANSWER) == 1
    assert b"HTTP/1.1 404 Not Found" in written.partition(ANSWER)[2]
    assert endpoints.paths == ["/v1/messages"]
    assert through_app == ["/healthz", "/v1/messages"]


async def test_a_connection_close_request_is_answered_then_closed() -> None:
    protocol, transport, _, _ = serving()
    protocol.data_received(post("/v1/chat/completions", close=True))
    written = await answered(transport, 1)
    assert b"connection: close" in written
    assert written.endswith(ANSWER)
    assert transport.closed

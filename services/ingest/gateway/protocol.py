"""uvicorn's httptools protocol, with the proxied calls taken straight to the proxy endpoints.

Measured under load, a proxied call spent about a tenth of the gateway's CPU in the ASGI
middleware stack it does not need (FastAPI's, Starlette's error and body-limit layers, uvicorn's
proxy-headers) and another tenth in a second socket send: uvicorn writes a response's head the
moment the app sends it, and its body in a separate send a moment later. On this kind of
machine a loopback send costs tens of microseconds. So, for a proxied call only:
- the request goes to `ProxyEndpoints` directly, not through the app's middleware;
- the response head is held back and written together with the first body bytes, one send.
Everything else (parsing, keep-alive, flow control, chunked encoding, header checks, error
answers) is uvicorn's own code, unchanged. Any other request, a pipelined one arriving while
another is answered, or an upgrade goes through uvicorn's usual path to the whole app.

It is built on uvicorn's private modules. protocol_contract.py lists what it takes from
them; its `http_protocol` picks uvicorn's own protocol instead (ProxyRoutes then answers the
proxied calls) when the installed uvicorn breaks that contract, and its test pins the uvicorn
this was checked with.
"""

from __future__ import annotations

import asyncio
import urllib.parse
from typing import Any, cast

import httptools
from uvicorn._types import ASGI3Application, ASGISendEvent
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from uvicorn.server import ServerState

from services.ingest.gateway.fastpath import ProxyEndpoints, answers


class GatewayProtocol(HttpToolsProtocol):
    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.endpoints = find_endpoints(self.app)

    def on_headers_complete(self) -> None:
        cycle = self.cycle
        if (
            self.endpoints is None
            or self.parser.get_method() != b"POST"
            or self.parser.should_upgrade()
            or self.limit_concurrency is not None
            or (cycle is not None and not cycle.response_complete)  # pipelined: uvicorn queues it
        ):
            super().on_headers_complete()
            return
        url = httptools.parse_url(self.url)
        raw_path: bytes = url.path
        path = raw_path.decode("ascii")
        if "%" in path:
            path = urllib.parse.unquote(path)
        if self.root_path or not answers("POST", path):
            super().on_headers_complete()
            return
        http_version = self.parser.get_http_version()
        self.scope["method"] = "POST"
        if http_version != "1.1":
            self.scope["http_version"] = http_version
        self.scope["path"] = path
        self.scope["raw_path"] = raw_path
        self.scope["query_string"] = url.query or b""
        self.cycle = OneSendCycle(
            scope=self.scope,
            transport=self.transport,
            flow=self.flow,
            logger=self.logger,
            access_logger=self.access_logger,
            access_log=self.access_log,
            default_headers=self.server_state.default_headers,
            message_event=asyncio.Event(),
            expect_100_continue=self.expect_100_continue,
            keep_alive=http_version != "1.0" and self.parser.should_keep_alive(),
            on_response=self.on_response_complete,
        )
        # The same ASGI callable; uvicorn's types name each message kind, starlette's do not.
        self._start_asgi_task(self.cycle, cast(ASGI3Application, self.endpoints))


class OneSendCycle(RequestResponseCycle):
    """A request-response cycle whose response head goes out with the first body bytes."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._held_start: ASGISendEvent | None = None

    async def send(self, message: ASGISendEvent) -> None:
        if message["type"] == "http.response.start" and not self.response_started:
            self._held_start = message  # a later start (uvicorn's 500) replaces it
            return
        start, self._held_start = self._held_start, None
        if start is None:
            await super().send(message)
            return
        transport, collected = self.transport, _Collected()
        self.transport = collected  # type: ignore[assignment]  # writes only, for two sends
        try:
            await super().send(start)
            await super().send(message)
        finally:
            self.transport = transport
        if not transport.is_closing():
            transport.write(b"".join(collected.parts))
        if collected.closed:
            transport.close()


class _Collected:
    """What uvicorn's send writes, kept to be written at once (and whether it closed)."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.parts.append(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


def find_endpoints(app: object) -> ProxyEndpoints | None:
    """The ingest app's ProxyEndpoints, looked for through the middleware uvicorn wraps it in."""
    while app is not None:
        endpoints = getattr(getattr(app, "state", None), "proxy_endpoints", None)
        if isinstance(endpoints, ProxyEndpoints):
            return endpoints
        app = getattr(app, "app", None)
    return None

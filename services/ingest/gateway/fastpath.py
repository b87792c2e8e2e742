"""The proxied calls and the OTLP receiver, served ahead of FastAPI: the hot paths as plain ASGI.

A proxied call needs no framework routing, dependency resolution or per-request span, and on a
small machine those cost more than the proxying itself. `ProxyEndpoints` answers every call in
the route table (services.ingest.gateway.routes, which documented.py documents from too): the provider
calls through `Gateway.serve`, `POST /v1/traces` through `TraceReceiver` (an export of a trace or
two is cheaper to decode than FastAPI's share of it). The HTTP server hands those calls to it
directly (services.ingest.gateway.protocol); `ProxyRoutes` does the same as middleware in front
of the app, for any other ASGI server (and the tests' in-process clients). Those calls are
excluded from FastAPI's tracing (`is_proxy_call`); they are still counted in
`http_server_requests_total` (by method and route template, in batches: one counter update per
second and label set instead of one per call) and still carry `x-tuneloop-served-by`.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import MutableMapping
from typing import Any

from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.ingest.gateway.calls import Gateway
from services.ingest.gateway.reading import gemini_method
from services.ingest.gateway.routes import ROUTES, ProxyRoute
from services.ingest.otlp.traces import TraceReceiver
from shared.telemetry import Telemetry

_FLUSH_S = 1.0


def is_proxy_call(scope: MutableMapping[str, Any]) -> bool:
    """True for the calls ProxyEndpoints answers (FastAPI's telemetry `exclude` hook)."""
    if scope.get("type") != "http":
        return False
    return answers(scope.get("method", ""), scope.get("path", ""))


def answers(method: str, path: str) -> bool:
    """Whether a request is one of the proxied provider calls or an OTLP trace export."""
    return ROUTES.match(method, path) is not None


class ProxyRoutes:
    """ASGI middleware: the proxied calls go to `endpoints`, everything else on to `app`.
    (services.ingest.gateway.protocol hands them to `endpoints` before any ASGI middleware.)"""

    def __init__(self, app: ASGIApp, endpoints: ProxyEndpoints) -> None:
        self.app = app
        self.endpoints = endpoints

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and answers(scope["method"], scope["path"]):
            await self.endpoints(scope, receive, send)
        else:
            await self.app(scope, receive, send)


class ProxyEndpoints:
    """Every call of the route table as one raw ASGI app; only ever given calls `answers`
    accepts."""

    def __init__(self, gateway: Gateway, telemetry: Telemetry, traces: TraceReceiver) -> None:
        self.gateway = gateway
        self.traces = traces
        self.telemetry = telemetry
        self._counts: Counter[tuple[str, str, int]] = Counter()  # method, template, status
        self._flush_pending = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = ROUTES.match(scope["method"], scope["path"])
        assert route is not None, f"{scope['method']} {scope['path']} is not a proxied call"
        status = 500  # what the client gets when serving raises before responding

        async def noting_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self._serve(route, scope, receive, noting_status)
        finally:
            self._count(route, status)

    async def _serve(self, route: ProxyRoute, scope: Scope, receive: Receive, send: Send) -> None:
        if route.family == "otlp":
            await self.traces(scope, receive, send)
        elif route.family == "gemini":
            await self._gemini(scope, receive, send)
        else:
            await self.gateway.serve(
                scope, receive, send, api=route.api, path=scope["path"],
                capture=route.capture == "captured", model_optional=route.model_optional,
            )  # fmt: skip

    async def _gemini(self, scope: Scope, receive: Receive, send: Send) -> None:
        # The model and the action are the path's last segment, `<model>:<action>`.
        method = gemini_method(scope["path"].rpartition("/")[2])
        if isinstance(method, Response):
            await self.gateway.refuse(method, scope, receive, send)
            return
        model, capture = method
        await self.gateway.serve(
            scope, receive, send, api="gemini", path=scope["path"], model=model, capture=capture
        )

    def _count(self, route: ProxyRoute, status: int) -> None:
        self._counts[(route.method, route.template, status)] += 1
        if not self._flush_pending:
            self._flush_pending = True
            asyncio.get_running_loop().call_later(_FLUSH_S, self.flush)

    def flush(self) -> None:
        """Add the calls counted since the last flush to the request counter."""
        counts, self._counts, self._flush_pending = self._counts, Counter(), False
        for (method, route, status), count in counts.items():
            self.telemetry.requests.add(
                count,
                {
                    "service": self.telemetry.service_name,
                    "method": method,
                    "route": route,
                    "status": str(status),
                },
            )

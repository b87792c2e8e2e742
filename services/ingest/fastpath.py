"""The proxy routes and the OTLP receiver, served ahead of FastAPI: the hot paths as plain ASGI.

A proxied call needs no framework routing, dependency resolution or per-request span, and on a
small machine those cost more than the proxying itself. `ProxyEndpoints` answers the three
provider paths through `Gateway.serve`, and `POST /v1/traces` through `TraceReceiver` (an
export of a trace or two is cheaper to decode than FastAPI's share of it). The HTTP server
hands those calls to it directly (services.ingest.gateway_protocol); `ProxyRoutes` does the
same as middleware in front of the app, for any other ASGI server (and the tests' in-process
clients). Those calls are excluded from FastAPI's tracing (`is_proxy_call`); they are still
counted in `http_server_requests_total` (by route template, in batches: one counter update per
second and label set instead of one per call) and still carry `x-tuneloop-served-by`.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import MutableMapping
from typing import Any

from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.ingest.gateway import (
    CAPTURED_PATHS,
    GEMINI_ACTIONS,
    GEMINI_PASSTHROUGH_ACTIONS,
    PASSTHROUGH_PATHS,
    Gateway,
    gemini_method,
    model_optional_call,
)
from services.ingest.routing import Api
from services.ingest.traces import TraceReceiver
from shared.telemetry import Telemetry

OTLP_TRACES = "/v1/traces"
GEMINI_PREFIX = "/v1beta/models/"
GEMINI_TEMPLATE = "/v1beta/models/{model_action}"
# google-genai calls /v1 by default. There only Gemini's own actions are Gemini calls: the rest of
# /v1/models is the hoster's (relayed), whose model ids hold colons too (ft:<base>:<suffix>:<job>).
GEMINI_V1_PREFIX = "/v1/models/"
_ALL_GEMINI_ACTIONS = frozenset((*GEMINI_ACTIONS, *GEMINI_PASSTHROUGH_ACTIONS))
_FLUSH_S = 1.0


def is_proxy_call(scope: MutableMapping[str, Any]) -> bool:
    """True for the calls ProxyEndpoints answers (FastAPI's telemetry `exclude` hook)."""
    if scope.get("type") != "http":
        return False
    return answers(scope.get("method", ""), scope.get("path", ""))


def answers(method: str, path: str) -> bool:
    """Whether a request is one of the proxied provider calls or an OTLP trace export."""
    if method == "POST" and (
        path in CAPTURED_PATHS
        or path in PASSTHROUGH_PATHS
        or path == OTLP_TRACES
        or _gemini_model_action(path)
    ):
        return True
    return model_optional_call(method, path) is not None


def _gemini_model_action(path: str) -> str | None:
    """`<model>:<action>` of a Gemini call's path, else None: anything under /v1beta/models/
    (an unknown action gets Gemini's 404), under /v1/models/ only Gemini's actions."""
    for prefix in (GEMINI_PREFIX, GEMINI_V1_PREFIX):
        if path.startswith(prefix):
            rest = path[len(prefix) :]
            if not rest or "/" in rest:
                return None
            if prefix == GEMINI_PREFIX or _gemini_v1_action(rest) is not None:
                return rest
    return None


def _gemini_v1_action(model_action: str) -> str | None:
    """The Gemini action `<model>:<action>` ends in, if it is one (the /v1 route's template)."""
    model, colon, action = model_action.rpartition(":")
    return action if model and colon and action in _ALL_GEMINI_ACTIONS else None


def _gemini_template(path: str, model_action: str) -> str:
    """The route template a Gemini call is counted under, as api.py documents it."""
    if path.startswith(GEMINI_PREFIX):
        return GEMINI_TEMPLATE
    return f"{GEMINI_V1_PREFIX}{{model}}:{_gemini_v1_action(model_action)}"


class ProxyRoutes:
    """ASGI middleware: the proxied calls go to `endpoints`, everything else on to `app`.
    (services.ingest.gateway_protocol hands them to `endpoints` before any ASGI middleware.)"""

    def __init__(self, app: ASGIApp, endpoints: ProxyEndpoints) -> None:
        self.app = app
        self.endpoints = endpoints

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and answers(scope["method"], scope["path"]):
            await self.endpoints(scope, receive, send)
        else:
            await self.app(scope, receive, send)


class ProxyEndpoints:
    """The three provider paths and the OTLP receiver as one raw ASGI app; only ever given
    calls `answers` accepts."""

    def __init__(self, gateway: Gateway, telemetry: Telemetry, traces: TraceReceiver) -> None:
        self.gateway = gateway
        self.traces = traces
        self.telemetry = telemetry
        self._counts: Counter[tuple[str, int]] = Counter()
        self._flush_pending = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope["path"]
        status = 500  # what the client gets when serving raises before responding

        async def noting_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        if path == OTLP_TRACES:
            try:
                await self.traces(scope, receive, noting_status)
            finally:
                self._count(path, status)
            return
        api: Api | None = CAPTURED_PATHS.get(path) or PASSTHROUGH_PATHS.get(path)
        if api is not None:
            capture = path in CAPTURED_PATHS
            try:
                await self.gateway.serve(
                    scope, receive, noting_status, api=api, path=path, capture=capture
                )
            finally:
                self._count(path, status)
            return
        model_action = _gemini_model_action(path) if scope["method"] == "POST" else None
        if model_action is None:
            optional = model_optional_call(scope["method"], path)
            assert optional is not None, f"{scope['method']} {path} is not a proxied call"
            api, counted_as = optional
            try:
                await self.gateway.serve(
                    scope, receive, noting_status, api=api, path=path, capture=False,
                    model_optional=True,
                )  # fmt: skip
            finally:
                self._count(counted_as, status)
            return
        try:
            await self._gemini(scope, receive, noting_status, model_action)
        finally:
            self._count(_gemini_template(path, model_action), status)

    async def _gemini(self, scope: Scope, receive: Receive, send: Send, model_action: str) -> None:
        method = gemini_method(model_action)
        if isinstance(method, Response):
            await self.gateway.refuse(method, scope, receive, send)
            return
        model, capture = method
        await self.gateway.serve(
            scope, receive, send, api="gemini", path=scope["path"], model=model, capture=capture
        )

    def _count(self, route: str, status: int) -> None:
        self._counts[(route, status)] += 1
        if not self._flush_pending:
            self._flush_pending = True
            asyncio.get_running_loop().call_later(_FLUSH_S, self.flush)

    def flush(self) -> None:
        """Add the calls counted since the last flush to the request counter."""
        counts, self._counts, self._flush_pending = self._counts, Counter(), False
        for (route, status), count in counts.items():
            self.telemetry.requests.add(
                count,
                {
                    "service": self.telemetry.service_name,
                    "method": "POST",
                    "route": route,
                    "status": str(status),
                },
            )

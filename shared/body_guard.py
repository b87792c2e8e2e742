"""What a request must pass before any route reads its body: the caller's key, then a size limit.

FastAPI reads and parses a JSON body before it runs a single dependency, so without this a
caller with no key could make a service read and parse as large a body as it liked before
hearing 401. `BodyGuard` (every service's app has it, see shared.service) acts at the moment a
route first asks for its body: it runs the route's own auth guard first (`require_admin`,
`require_service` or `require_principal` from shared.auth, found among its dependencies), then refuses a body
over the limit with 413: at once when Content-Length declares it, and as soon as a chunked body
passes it (reading stops there; nothing past the limit is buffered).

A route that streams its body under a limit of its own (`/v1/files`, `/v1/samples/import`) is
marked `@reads_own_body` and passes untouched. The gateway's proxied calls and `/v1/traces` are
answered ahead of FastAPI (services/ingest/gateway/fastpath.py) and never reach this.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from typing import Any, Literal, TypeVar

from fastapi import HTTPException, status
from fastapi.dependencies.models import Dependant
from sqlalchemy.engine import Engine
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shared import auth
from shared.settings import AuthSettings

Endpoint = TypeVar("Endpoint", bound=Callable[..., Any])
Guard = Literal["admin", "service", "tenant"]
_OWN_BODY = "_tuneloop_reads_own_body"
# Before a 413, what the client already sent is read and dropped: at most this much, this long.
DRAIN_BYTES = 1 << 20
DRAIN_S = 0.25


def reads_own_body(endpoint: Endpoint) -> Endpoint:
    """Mark a route that reads its body itself under a limit of its own (an upload, an import):
    BodyGuard leaves its body alone. Such a route checks the key before it reads."""
    setattr(endpoint, _OWN_BODY, True)
    return endpoint


def _calls(dependant: Dependant) -> Iterator[Any]:
    for sub in dependant.dependencies:
        yield sub.call
        yield from _calls(sub)


def route_guard(route: object) -> Guard | None:
    """Which key a route demands, from its dependencies: the admin token, a tenant key, or none."""
    dependant = getattr(route, "dependant", None)
    if not isinstance(dependant, Dependant):
        return None
    calls = set(_calls(dependant))
    if auth.require_admin in calls:
        return "admin"
    if auth.require_service in calls:
        return "service"
    if auth.require_principal in calls:
        return "tenant"
    return None


class BodyGuard:
    """ASGI middleware: the key before the body, and a body limit for every route that does not
    read its own (`reads_own_body`)."""

    def __init__(self, app: ASGIApp, *, max_bytes: int, engine: Engine) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.engine = engine  # the app's own (app.state.db_engine), as its routes use

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        gate = _Gate(self, scope, receive)

        async def noting_start(message: Message) -> None:
            if message["type"] == "http.response.start":
                gate.answered = True
            await send(message)

        await self.app(scope, gate.receive, noting_start)

    async def check_key(self, scope: Scope) -> None:
        """The route's own guard, run now; raises its HTTPException (401) when it refuses. The
        route runs it again as a dependency: one more key lookup, for calls with a body only."""
        guard = route_guard(scope.get("route"))
        request = Request(scope)
        if guard == "admin":
            auth.require_admin(request, _auth_settings(scope))
        elif guard == "service":
            auth.require_service(request, _auth_settings(scope))
        elif guard == "tenant":
            # In a thread: the lookup is a database query.
            await asyncio.to_thread(auth.require_principal, request, self.engine)

    def too_large(self) -> HTTPException:
        return HTTPException(
            status.HTTP_413_CONTENT_TOO_LARGE,
            detail=f"request body: over the limit of {self.max_bytes} bytes for this route",
        )


class _Gate:
    """One request's `receive`: the first call (the route asking for its body) runs the checks;
    every call counts the bytes. Once the response has started, calls pass through (a
    streaming response listens on `receive` for the client going away)."""

    def __init__(self, guard: BodyGuard, scope: Scope, receive: Receive) -> None:
        self.guard = guard
        self.scope = scope
        self._receive = receive
        self.checked = False
        self.answered = False
        self.limited = True
        self.received = 0

    async def receive(self) -> Message:
        if self.answered:
            return await self._receive()
        if not self.checked:
            self.checked = True
            await self._first()
        message = await self._receive()
        if self.limited and message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            if self.received > self.guard.max_bytes:
                if message.get("more_body", False):
                    await self._drain()
                raise self.guard.too_large()
        return message

    async def _drain(self) -> None:
        """Read what the client already sent, a bounded amount, before the 413: a connection
        closed over unread bytes is reset, and the reset can reach the client before the answer
        and discard it (nginx drains for the same reason: its lingering close)."""
        drained = 0
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(DRAIN_S):
                while drained < DRAIN_BYTES:
                    message = await self._receive()
                    if message["type"] != "http.request":
                        return
                    drained += len(message.get("body", b""))
                    if not message.get("more_body", False):
                        return

    async def _first(self) -> None:
        route = self.scope.get("route")
        if getattr(getattr(route, "endpoint", None), _OWN_BODY, False):
            self.limited = False
            return
        await self.guard.check_key(self.scope)
        declared = _content_length(self.scope)
        if declared is not None and declared > self.guard.max_bytes:
            await self._drain()
            raise self.guard.too_large()


def _auth_settings(scope: Scope) -> AuthSettings:
    """The admin token's settings as the route's own `require_admin` gets them (a test may
    override `get_auth_settings`), so the early check and the route never disagree."""
    overrides = getattr(scope.get("app"), "dependency_overrides", {})
    provider = overrides.get(auth.get_auth_settings, auth.get_auth_settings)
    settings: AuthSettings = provider()
    return settings


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None

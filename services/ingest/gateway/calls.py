"""The gateway: authenticate the caller, find the upstream for the model, forward, capture.

Every refusal is answered in the shape of the API family the caller speaks (services.ingest.gateway.provider_errors),
so the official SDKs raise their usual exceptions: 401 for a missing or bad tuneloop key, 400 for
an unreadable body, 404 for an unknown model, 413 for a body over the limit, 502 when the
upstream cannot be reached.

`Gateway.serve` is a raw ASGI handler for one proxied call. Which calls those are, and how each is
served (API family, captured or relayed, model optional), is the table in
services.ingest.gateway.routes; services.ingest.gateway.fastpath dispatches from it ahead of FastAPI, so a
proxied call pays for no framework routing, dependency resolution or per-request span.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from services.ingest.capture.call import CapturedCall
from services.ingest.config import IngestSettings
from services.ingest.gateway import targets
from services.ingest.gateway.provider_errors import error_response, model_not_found
from services.ingest.gateway.proxy import (
    Incoming,
    UpstreamUnreachable,
    forward,
    parse_tags,
    routed_body,
    upstream_headers,
    upstream_target,
)
from services.ingest.gateway.purpose import TAG_PREFIX as PURPOSE_PREFIX
from services.ingest.gateway.purpose import PurposeRefused, check_tags, purpose_tag
from services.ingest.gateway.reading import (
    SHADOW_PAIR_PREFIX,
    check_version_tags,
    model_from_body,
    presented_call_key,
)
from services.ingest.gateway.routing import Api, Route, RoutingTable
from services.ingest.gateway.upstream_pool import UpstreamError, UpstreamPool
from services.ingest.gateway.wake import WakeFailed, Waker
from shared.auth import (
    ACCEPTED_KEY_SOURCES,
    AuthError,
    CachedAuthenticator,
    MissingKeyError,
    Principal,
    ScopeError,
    check_scope,
    presented_key,
)
from shared.auth import Scope as AuthScope
from shared.events import Event

log = logging.getLogger("tuneloop.ingest.gateway")

_MISSING_KEY = f"missing tuneloop API key: send it as {ACCEPTED_KEY_SOURCES}"
# Provider calls cost money and make samples: a read key may not make them (docs/keys.md).
GATEWAY_SCOPES: tuple[AuthScope, ...] = ("write", "internal")


class BodyTooLarge(Exception):
    pass


class Gateway:
    def __init__(
        self,
        *,
        settings: IngestSettings,
        routes: RoutingTable,
        authenticator: CachedAuthenticator,
        capture: Callable[[CapturedCall], object],  # what it returns is not used
        served_by: str = "ingest",
        report: Callable[[Event], Awaitable[None]] | None = None,
        waker: Waker | None = None,
    ) -> None:
        self._waker = waker
        self.settings = settings
        self.routes = routes
        # Where a canary's verdict goes (the bus): off the caller's path, after its answer.
        self._report = report
        self._reports: set[asyncio.Task[None]] = set()
        self._authenticator = authenticator
        self._capture = capture
        # Sent with every answer, as the ServedBy middleware does for FastAPI's routes.
        self.served_by = [(b"x-tuneloop-served-by", served_by.encode())]
        self.client = UpstreamPool(
            connect_timeout_s=settings.upstream_connect_timeout_s,
            read_timeout_s=settings.upstream_read_timeout_s,
            max_connections=settings.upstream_max_connections,
            idle_s=settings.upstream_idle_s,
        )

    async def aclose(self) -> None:
        await self.client.aclose()
        if self._waker is not None:
            await self._waker.client.aclose()

    async def authenticate(self, request: Request) -> Principal:
        """The caller's principal (cached; a miss asks the database in a worker thread, never
        on the event loop); raises AuthError saying what is wrong. For the routes FastAPI
        serves (uploads, samples); the proxy path and the OTLP receiver do the same in `serve`
        and `admit`."""
        key = presented_key(request)
        if key is None:
            raise MissingKeyError(_MISSING_KEY)
        return await self._authenticator.verify(key)

    async def admit(self, scope: Scope, receive: Receive) -> tuple[str, bytes]:
        """The caller's tenant and the whole request body, for the OTLP receiver: an export
        makes samples, so it needs a `write` key (see `admit_principal`)."""
        principal, body = await self.admit_principal(scope, receive, accepted=("write",))
        return principal.tenant_id, body

    async def admit_principal(
        self, scope: Scope, receive: Receive, *, accepted: tuple[AuthScope, ...]
    ) -> tuple[Principal, bytes]:
        """The caller's principal and the whole request body, for the raw ASGI endpoints.
        Raises AuthError (a 401), ScopeError (a 403: the key's scope grants none of
        `accepted`) or BodyTooLarge (a 413), each before reading more than the limit."""
        headers: list[tuple[bytes, bytes]] = scope["headers"]
        key = presented_call_key(headers, scope.get("query_string", b"").decode("latin-1"))
        if key is None:
            raise MissingKeyError(_MISSING_KEY)
        principal = await self._authenticator.verify(key)
        check_scope(principal, *accepted, action=f"{scope['method']} {scope['path']}")
        return principal, await self._body(headers, receive)

    async def serve(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        *,
        api: Api,
        path: str,
        model: str | None = None,
        capture: bool = True,
        model_optional: bool = False,
    ) -> None:
        """Proxy one call. `model` is given for Gemini (it is in the path); else read from the
        body. `capture`: whether the answered call becomes a sample. `model_optional`: a body
        without a model (or no body) is routed to the API family's first upstream."""
        outcome = await self._prepare(
            scope, receive, api=api, model=model, model_optional=model_optional
        )
        if isinstance(outcome, Response):
            await self.refuse(outcome, scope, receive, send)
            return
        incoming, tenant, model = outcome
        routes = self.routes
        route = (
            routes.resolve(api, model, tenant, lambda: split_key(incoming, tenant))
            if model is not None
            else routes.first(api)
        )
        if route is None:
            refusal = (
                model_not_found(api, model, path=incoming.raw_path)
                if model is not None
                else error_response(api, 404, f"no {api} upstream is configured")
            )
            await self.refuse(refusal, scope, receive, send)
            return
        if routes.is_cold(route):
            woken = await self._wake(route, api, model)
            if isinstance(woken, Response):
                await self.refuse(woken, scope, receive, send)
                return
            route = woken
        caller_tags = list(incoming.tags)
        shadow = (
            routes.shadow(tenant, route, lambda: split_key(incoming, tenant))
            if route.served_name is not None and capture
            else None
        )
        if shadow is not None:  # both answers carry the pair's tag, for pairwise scoring
            pair = f"{SHADOW_PAIR_PREFIX}{os.urandom(8).hex()}"
            incoming.tags.append(pair)
            caller_tags += [pair, SHADOW_PURPOSE]
        if route.tags:  # a deployment's answer: the sample says which version gave it
            incoming.tags = [*incoming.tags, *route.tags]
        started = time.perf_counter()
        status = 502
        try:
            status = await forward(
                client=self.client,
                incoming=incoming,
                route=route,
                api=api,
                path=incoming.raw_path if api == "gemini" else path,
                tenant=tenant,
                receive=receive,
                send=send,
                response_headers=self.served_by,
                capture=self._submit if capture else None,
                model_from_path=model if api == "gemini" else None,
            )
        except UpstreamUnreachable as exc:
            log.warning("upstream %s unreachable: %s", route.upstream, exc.__cause__)
            refusal = error_response(
                api, 502, f"upstream {route.upstream} could not be reached ({exc})"
            )
            await self.refuse(refusal, scope, receive, send)
        finally:
            if route.canary:
                self._observe(tenant, route, status, (time.perf_counter() - started) * 1000)
        if shadow is not None and status < 500:
            shadowed = replace(incoming, tags=[*caller_tags, *shadow.tags])
            self._background(self._mirror(shadowed, shadow, api, path, tenant))

    async def _mirror(
        self, incoming: Incoming, route: Route, api: Api, path: str, tenant: str
    ) -> None:
        """Send an answered call to the served name's shadow too and keep its answer as a
        sample (never the caller's: it has its answer already). A shadow that cannot be reached
        is logged and kept as a failed sample (502), so its pair is counted as a failure."""
        started_at, start = datetime.now(UTC), time.perf_counter()
        content_type, encoding = "application/json", ""
        try:
            upstream = await self.client.request(
                incoming.method,
                route.base_url,
                upstream_target(incoming),
                upstream_headers(incoming, route),
                routed_body(incoming.body, route),
            )
            try:
                if upstream.content_length is not None:
                    body = await upstream.read()
                else:
                    chunks = []
                    while (chunk := await upstream.next_chunk()) is not None:
                        chunks.append(chunk)
                    body = b"".join(chunks)
            finally:
                upstream.release()
            status = upstream.status
            content_type = (upstream.header(b"content-type") or b"").decode("latin-1")
            encoding = (upstream.header(b"content-encoding") or b"").decode("latin-1")
        except UpstreamError as exc:
            log.warning("shadow %s of tenant %s unreachable: %s", route.upstream, tenant, exc)
            status = 502
            error = {"message": f"the shadow could not be reached: {exc}", "type": "unreachable"}
            body = orjson.dumps({"error": error})
        self._submit(
            CapturedCall(
                api=api,
                tenant=tenant,
                request_id=os.urandom(16).hex(),
                request_body=incoming.body,
                status=status,
                response_body=body,
                content_type=content_type,
                content_encoding=encoding,
                started_at=started_at,
                latency_ms=(time.perf_counter() - start) * 1000,
                tags=incoming.tags,
                path=path,
            )
        )

    def _background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._reports.add(task)
        task.add_done_callback(self._reports.discard)

    async def _wake(self, route: Route, api: Api, model: str | None) -> Route | Response:
        """A cold deployment loaded again (the call waits), or the 503 to answer."""
        assert route.deployment_id is not None
        if self._waker is None:
            return route  # nobody to ask: the call goes on, and the engine says what it says
        try:
            endpoint = await self._waker.wake(route.deployment_id)
        except WakeFailed as exc:
            log.warning("deployment %s could not be woken: %s", route.deployment_id, exc)
            refusal = error_response(api, 503, f"model {model}: its deployment is cold and {exc}")
            refusal.raw_headers.append((b"retry-after", b"10"))
            return refusal
        return self.routes.woke(route, endpoint)

    def _observe(self, tenant: str, route: Route, status: int, latency_ms: float) -> None:
        verdict = self.routes.observe(tenant, route, status < 500, latency_ms)
        if verdict is None:
            return
        log.warning(
            "served name %s of tenant %s: canary %s stopped here (%s); reporting it",
            verdict.name, tenant, verdict.deployment_id, verdict.reason,
        )  # fmt: skip
        if self._report is not None:
            self._background(self._send_report(verdict))

    async def _send_report(self, event: Event) -> None:
        assert self._report is not None
        try:
            await self._report(event)
        except Exception:  # the bus away: this gateway has stopped the canary's share anyway
            log.exception("canary verdict for %s not published", event.event_id)

    async def _prepare(
        self,
        scope: Scope,
        receive: Receive,
        *,
        api: Api,
        model: str | None,
        model_optional: bool = False,
    ) -> tuple[Incoming, str, str | None] | Response:
        """The call read and checked: (incoming, tenant, model), or the refusal to send. The
        model is None only for a `model_optional` call whose body names none."""
        headers: list[tuple[bytes, bytes]] = scope["headers"]
        try:
            principal, body = await self.admit_principal(scope, receive, accepted=GATEWAY_SCOPES)
            incoming = Incoming(
                method=scope["method"],
                raw_path=targets.checked_path(scope.get("raw_path") or scope["path"].encode()),
                query=targets.checked_query(scope.get("query_string", b"")),
                headers=headers,
                body=body,
            )
        except AuthError as exc:  # a missing key included
            return error_response(api, 401, str(exc), code="invalid_api_key")
        except ScopeError as exc:
            return error_response(api, 403, str(exc), code="insufficient_scope")
        except BodyTooLarge as exc:
            return error_response(api, 413, str(exc))
        except targets.BadTarget as exc:
            return error_response(api, 400, str(exc))
        if model is None and (incoming.body or not model_optional):
            model_or_error = model_from_body(incoming.body, api, required=not model_optional)
            if isinstance(model_or_error, Response):
                return model_or_error
            model = model_or_error
        incoming.tags = parse_tags(headers)
        try:
            check_tags(incoming.tags)
            check_version_tags(incoming.tags)
            purpose = purpose_tag(headers, principal)
        except PurposeRefused as exc:
            return error_response(api, exc.status, str(exc))
        if purpose is not None:
            incoming.tags.append(purpose)
        return incoming, principal.tenant_id, model

    async def _body(self, headers: list[tuple[bytes, bytes]], receive: Receive) -> bytes:
        limit = self.settings.max_body_bytes
        declared = next((v for k, v in headers if k == b"content-length"), b"")
        if declared.isdigit() and int(declared) > limit:
            raise BodyTooLarge(
                f"request body of {declared.decode()} bytes is over the {limit}-byte limit"
            )
        parts: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise BodyTooLarge(f"request body is over the {limit}-byte limit")
            parts.append(chunk)
            if not message.get("more_body", False):
                break
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def refuse(self, response: Response, scope: Scope, receive: Receive, send: Send) -> None:
        response.raw_headers += self.served_by
        await response(scope, receive, send)

    def _submit(self, call: CapturedCall) -> None:
        try:
            self._capture(call)
        except Exception:  # capture must never hurt the call that was already answered
            log.exception("capture of call %s failed", call.request_id)


# The shadow's sample of a mirrored call also carries `purpose:shadow` (reading.SHADOW_PAIR_PREFIX).
SHADOW_PURPOSE = f"{PURPOSE_PREFIX}shadow"


def split_key(incoming: Incoming, tenant: str) -> bytes:
    """What a canary split hashes: the caller's X-Request-Id when it sends one, else its
    tenant and body, so a retried call lands on the version that answered it first."""
    for name, value in incoming.headers:
        if name == b"x-request-id" and value:
            return value
    return tenant.encode() + b"\0" + incoming.body

"""The gateway: authenticate the caller, find the upstream for the model, forward, capture.

Every refusal is answered in the shape of the API family the caller speaks (services.ingest.errors),
so the official SDKs raise their usual exceptions: 401 for a missing or bad tuneloop key, 400 for
an unreadable body, 404 for an unknown model, 413 for a body over the limit, 502 when the
upstream cannot be reached.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import httpx
import orjson
from starlette.requests import Request
from starlette.responses import Response

from services.ingest.capture import CapturedCall
from services.ingest.config import IngestSettings
from services.ingest.errors import error_response, model_not_found
from services.ingest.proxy import forward
from services.ingest.routing import Api, RoutingTable
from shared.auth import (
    ACCEPTED_KEY_SOURCES,
    AuthError,
    CachedAuthenticator,
    MissingKeyError,
    Principal,
    presented_key,
)

log = logging.getLogger("tuneloop.ingest.gateway")

GEMINI_ACTIONS = ("generateContent", "streamGenerateContent")


class Gateway:
    def __init__(
        self,
        *,
        settings: IngestSettings,
        routes: RoutingTable,
        authenticator: CachedAuthenticator,
        capture: Callable[[CapturedCall], None],
    ) -> None:
        self.settings = settings
        self.routes = routes
        self._authenticate = authenticator
        self._capture = capture
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(
                settings.upstream_read_timeout_s, connect=settings.upstream_connect_timeout_s
            ),
            limits=httpx.Limits(
                max_connections=settings.upstream_max_connections, max_keepalive_connections=128
            ),
        )

    async def aclose(self) -> None:
        await self.client.aclose()

    def authenticate(self, request: Request) -> Principal:
        """The caller's principal (cached); raises AuthError saying what is wrong."""
        key = presented_key(request)
        if key is None:
            raise MissingKeyError(f"missing tuneloop API key: send it as {ACCEPTED_KEY_SOURCES}")
        return self._authenticate(key)

    def _tenant(self, request: Request, api: Api) -> str | Response:
        key = presented_key(request)
        if key is None:
            return error_response(
                api, 401, f"missing tuneloop API key: send it as {ACCEPTED_KEY_SOURCES}"
            )
        try:
            return self._authenticate(key).tenant_id
        except AuthError as exc:
            return error_response(api, 401, str(exc))

    async def _body(self, request: Request, api: Api) -> bytes | Response:
        declared = request.headers.get("content-length")
        limit = self.settings.max_body_bytes
        if declared and declared.isdigit() and int(declared) > limit:
            return error_response(
                api, 413, f"request body of {declared} bytes is over the {limit}-byte limit"
            )
        body = await request.body()
        if len(body) > limit:
            return error_response(api, 413, f"request body is over the {limit}-byte limit")
        return body

    async def handle(
        self, request: Request, *, api: Api, path: str, model: str | None = None
    ) -> Response:
        """Proxy one call. `model` is given for Gemini (it is in the path); else read from the body."""
        tenant = self._tenant(request, api)
        if isinstance(tenant, Response):
            return tenant
        body = await self._body(request, api)
        if isinstance(body, Response):
            return body
        if model is None:
            model_or_error = _model_from_body(body, api)
            if isinstance(model_or_error, Response):
                return model_or_error
            model = model_or_error
        route = self.routes.resolve(api, model)
        if route is None:
            return model_not_found(api, model)
        try:
            return await forward(
                client=self.client,
                request=request,
                body=body,
                route=route,
                api=api,
                path=path,
                tenant=tenant,
                capture=self._submit,
                model_from_path=model if api == "gemini" else None,
            )
        except httpx.HTTPError as exc:
            log.warning("upstream %s unreachable: %s: %s", route.upstream, type(exc).__name__, exc)
            return error_response(
                api, 502, f"upstream {route.upstream} could not be reached ({type(exc).__name__})"
            )

    def _submit(self, call: CapturedCall) -> None:
        try:
            self._capture(call)
        except Exception:  # capture must never hurt the call that was already answered
            log.exception("capture of call %s failed", call.request_id)


def _model_from_body(body: bytes, api: Api) -> str | Response:
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        return error_response(api, 400, f"request body is not valid JSON: {exc}")
    if not isinstance(document, dict):
        return error_response(api, 400, "request body must be a JSON object")
    model = document.get("model")
    if not isinstance(model, str) or not model:
        return error_response(api, 400, "model: required, a non-empty string", param="model")
    return model

"""The FastAPI routes that document the provider-compatible gateway and the OTLP receiver, made
from their one route table (gateway/routes.py). The fast path (fastpath.py) answers these calls
before FastAPI routes anything; reached all the same (an app without it in front), a route hands
the call to the same ProxyEndpoints, so it is served and counted the same way."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.types import Receive, Scope, Send

from services.ingest.gateway.routes import ROUTES, ProxyRoute
from shared.body_guard import reads_own_body

router = APIRouter()


class _Asgi(Response):
    """A route's answer that hands the connection to a raw ASGI endpoint."""

    def __init__(self, endpoint: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        super().__init__()
        self._endpoint = endpoint

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._endpoint(scope, receive, send)


def _proxied(route: ProxyRoute) -> Callable[..., Awaitable[Response]]:
    """The endpoint of the FastAPI route that documents one entry of the table."""

    @reads_own_body  # the gateway checks the key, then reads the body under a limit of its own
    async def proxied(request: Request, **path_params: str) -> Response:
        return _Asgi(request.app.state.proxy_endpoints)

    # The template's parameters, declared as FastAPI would for `def f(model: str, ...)`.
    template_params = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=str)
        for name in route.params
    ]
    request = inspect.Parameter("request", inspect.Parameter.KEYWORD_ONLY, annotation=Request)
    proxied.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [*template_params, request], return_annotation=Response
    )
    proxied.__name__ = route.name
    proxied.__doc__ = route.description or None
    return proxied


for _route in ROUTES.routes:
    router.add_api_route(
        _route.template,
        _proxied(_route),
        methods=[_route.method],
        tags=["otlp" if _route.family == "otlp" else "gateway"],
        summary=_route.summary,
    )

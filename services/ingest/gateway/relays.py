"""The FastAPI routes of the control plane's relays: `/v1/<prefix>` and `/v1/<prefix>/...` for
every prefix another service owns (forwarding.OWNERS), each method its own route, sent on by
forwarding.relay with the caller's own credentials."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from services.ingest.gateway import forwarding
from services.ingest.http.deps import IngestDep, principal
from services.ingest.runtime import Ingest

router = APIRouter()
Forward = Callable[[Request, Ingest], Awaitable[Response]]


def _forwarder(prefix: str, service: str) -> Forward:
    async def forward(request: Request, ingest: IngestDep) -> Response:
        if request.method not in ("GET", "HEAD"):
            # The owner checks every call too; a read key's changes stop here, early.
            await principal(request, ingest)
        return await forwarding.relay(
            ingest.control_client, request, ingest.services[service], service
        )

    forward.__name__ = f"forward_{prefix}"
    forward.__doc__ = f"Relayed to the {service} service."
    return forward


def _nested_forwarder(prefix: str, service: str) -> Any:
    """`_forwarder` for `/v1/<prefix>/{rest:path}`: `rest` is in the signature so that the
    OpenAPI document declares the path parameter (the relay sends the raw path on)."""
    forward = _forwarder(prefix, service)

    async def forward_nested(rest: str, request: Request, ingest: IngestDep) -> Response:
        return await forward(request, ingest)

    forward_nested.__name__ = f"forward_{prefix}_nested"
    forward_nested.__doc__ = forward.__doc__
    return forward_nested


_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]
for _prefix, _service in forwarding.OWNERS.items():
    for _path, _forward in (
        (f"/v1/{_prefix}", _forwarder(_prefix, _service)),
        (f"/v1/{_prefix}/{{rest:path}}", _nested_forwarder(_prefix, _service)),
    ):
        # A route per method: FastAPI names a many-method route's operations after one of its
        # methods, so they would share one OpenAPI operation id.
        for _method in _METHODS:
            router.add_api_route(_path, _forward, methods=[_method], tags=[f"{_service} (relayed)"])

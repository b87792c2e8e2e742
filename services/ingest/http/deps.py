"""The dependencies ingest's routes take: the running service (`IngestDep`), the database engine,
and the caller of a route that reads its own body (`principal`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.engine import Engine

from services.ingest.http.errors import Forbidden, Unauthorized
from services.ingest.runtime import Ingest
from shared import auth
from shared.db import get_engine


async def get_ingest(request: Request) -> Ingest:
    # async: a plain `def` dependency would cost a thread-pool round trip per request.
    ingest: Ingest = request.app.state.ingest
    return ingest


IngestDep = Annotated[Ingest, Depends(get_ingest)]
EngineDep = Annotated[Engine, Depends(get_engine)]


async def principal(request: Request, ingest: Ingest) -> auth.Principal:
    """The caller, whose key's scope allows the method (a read key only reads: 403). Called by
    the route itself, not as a dependency: a route that reads its own body checks the key first
    (with the gateway's cache of keys)."""
    try:
        caller = await ingest.gateway.authenticate(request)
        action = f"{request.method} {request.url.path}"
        return auth.check_scope(caller, *auth.scopes_for_method(request.method), action=action)
    except auth.AuthError as exc:
        raise Unauthorized(str(exc)) from None
    except auth.ScopeError as exc:
        raise Forbidden(str(exc)) from None

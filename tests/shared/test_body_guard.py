"""BodyGuard on a real server socket: the key is checked before a route reads its body, and a
body over the limit gets 413 whether its length was declared or it arrived chunked."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import uvicorn
from fastapi import Depends, FastAPI, Request
from pydantic import BaseModel, SecretStr
from sqlalchemy.engine import Engine
from sqlmodel import Session

from shared.auth import (
    PrincipalDep,
    create_tenant,
    get_auth_settings,
    issue_api_key,
    require_admin,
)
from shared.body_guard import BodyGuard, reads_own_body, route_guard
from shared.settings import AuthSettings
from tests.plugins.infra import free_port
from tests.raw_socket import chunked, json_of, raw_post, status_of

ADMIN_TOKEN = "test-admin-token-5a4b3c2d"
LIMIT = 64 * 1024


class Spec(BaseModel):
    name: str
    notes: str = ""


def _app(engine: Engine) -> FastAPI:
    settings = AuthSettings(admin_token=SecretStr(ADMIN_TOKEN))
    app = FastAPI()
    app.state.db_engine = engine
    app.dependency_overrides[get_auth_settings] = lambda: settings

    @app.post("/tenant")
    def tenant_route(spec: Spec, principal: PrincipalDep) -> dict[str, Any]:
        return {"tenant": principal.tenant_id, "name": spec.name}

    @app.post("/admin", dependencies=[Depends(require_admin)])
    def admin_route(spec: Spec) -> dict[str, str]:
        return {"name": spec.name}

    @app.post("/open")
    def open_route(spec: Spec) -> dict[str, int]:
        return {"notes": len(spec.notes)}

    @app.post("/own")
    @reads_own_body
    async def own_route(request: Request) -> dict[str, int]:
        return {"bytes": sum([len(chunk) async for chunk in request.stream()])}

    app.add_middleware(BodyGuard, max_bytes=LIMIT, engine=engine)
    return app


@dataclass
class Served:
    port: int
    key: str

    def post(self, path: str, headers: dict[str, str], chunks: Iterable[bytes]) -> bytes:
        return raw_post("127.0.0.1", self.port, path, headers, chunks)


@pytest.fixture
def served(db_engine: Engine, db_session: Session) -> Iterator[Served]:
    create_tenant(db_session, tenant_id="acme", name="Acme")
    _, key = issue_api_key(db_session, tenant_id="acme", name="ci")
    config = uvicorn.Config(_app(db_engine), port=free_port(), log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    for _ in range(250):
        if server.started:
            break
        threading.Event().wait(0.02)
    try:
        yield Served(config.port, key)
    finally:
        server.should_exit = True
        thread.join(5)


JSON = {"content-type": "application/json"}
BEGUN = b'{"name": "a", "notes": "'


@pytest.mark.parametrize(
    ("path", "headers"),
    [
        ("/tenant", {}),
        ("/tenant", {"authorization": "Bearer tl_zzzzzzzz_" + "A" * 43}),
        ("/admin", {}),
        ("/admin", {"authorization": "Bearer not-the-admin-token"}),
    ],
)
def test_a_refused_key_is_answered_before_the_body_arrives(
    served: Served, path: str, headers: dict[str, str]
) -> None:
    # 2 MiB declared, a few bytes sent: a route that read its body first would wait for the
    # rest (and this socket would time out) before saying the key is wrong.
    declared = {"content-length": str(2 * 1024**2)}
    answer = served.post(path, JSON | declared | headers, [BEGUN])
    assert status_of(answer) == 401, answer[:300]
    assert "detail" in json_of(answer)


def test_a_body_declared_over_the_limit_is_refused_before_it_is_read(served: Served) -> None:
    key = {"authorization": f"Bearer {served.key}"}
    for path, headers in [("/tenant", key), ("/admin", {}), ("/open", {})]:
        if path == "/admin":
            headers = {"authorization": f"Bearer {ADMIN_TOKEN}"}
        declared = {"content-length": str(LIMIT + 1)}
        answer = served.post(path, JSON | declared | headers, [BEGUN])
        assert status_of(answer) == 413, (path, answer[:300])
        assert json_of(answer)["detail"] == (
            f"request body: over the limit of {LIMIT} bytes for this route"
        )


def test_a_chunked_body_is_cut_off_once_it_passes_the_limit(served: Served) -> None:
    key = {"authorization": f"Bearer {served.key}", "transfer-encoding": "chunked"}
    filler = b"x" * 8192
    # Just past the limit and no end: a server still reading would wait for the rest (and
    # this socket would time out) instead of answering.
    chunks = [BEGUN, *[filler] * (LIMIT // len(filler) + 1)]
    answer = served.post("/tenant", JSON | key, chunked(chunks, end=False))
    assert status_of(answer) == 413, answer[:300]
    assert str(LIMIT) in json_of(answer)["detail"]


def test_bodies_within_the_limit_are_served(served: Served) -> None:
    body = json.dumps({"name": "a", "notes": "x" * (LIMIT - 100)}).encode()
    key = {"authorization": f"Bearer {served.key}"}
    length = {"content-length": str(len(body))}
    answer = served.post("/tenant", JSON | key | length, [body])
    assert status_of(answer) == 200, answer[:300]
    assert json_of(answer) == {"tenant": "acme", "name": "a"}
    # Chunked, in pieces: counted, not refused.
    pieces = [body[i : i + 1000] for i in range(0, len(body), 1000)]
    answer = served.post("/open", JSON | {"transfer-encoding": "chunked"}, chunked(pieces))
    assert json_of(answer) == {"notes": LIMIT - 100}


def test_a_route_that_reads_its_own_body_is_not_limited(served: Served) -> None:
    body = b"y" * (3 * LIMIT)
    answer = served.post("/own", {"content-length": str(len(body))}, [body])
    assert status_of(answer) == 200, answer[:300]
    assert json_of(answer) == {"bytes": 3 * LIMIT}


def test_route_guard_reads_the_guard_from_the_dependencies(db_engine: Engine) -> None:
    routes = {getattr(route, "path", ""): route for route in _app(db_engine).routes}
    assert route_guard(routes["/tenant"]) == "tenant"
    assert route_guard(routes["/admin"]) == "admin"
    assert route_guard(routes["/open"]) is None

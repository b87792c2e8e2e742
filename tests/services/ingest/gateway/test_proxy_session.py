"""The gateway's upstream session and its control-plane client are shared by every tenant:
nothing one call's answer sets may ride along on the next call (a real aiohttp server as the
upstream, reached by host name, as a provider is: cookie jars refuse cookies from bare IPs)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from aiohttp import web
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from services.ingest.gateway.forwarding import control_client, relay
from services.ingest.gateway.upstream_pool import UpstreamPool
from tests.plugins.infra import free_port


@pytest.fixture
async def cookie_setting_upstream() -> AsyncIterator[tuple[str, list[str | None]]]:
    """An upstream that sets a cookie on every answer and notes the Cookie header it got."""
    seen: list[str | None] = []

    async def answer(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Cookie"))
        response = web.json_response({"ok": True})
        response.headers["Set-Cookie"] = f"__cf_bm=call-{len(seen)}; Path=/; HttpOnly"
        return response

    async def two_cookies(request: web.Request) -> web.Response:
        response = web.json_response({"ok": True})
        response.headers.add("Set-Cookie", "a=1; Expires=Wed, 09 Jun 2027 10:18:14 GMT")
        response.headers.add("Set-Cookie", "b=2; Path=/")
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", answer)
    app.router.add_get("/v1/fine_tuning/jobs", answer)
    app.router.add_get("/v1/fine_tuning/two-cookies", two_cookies)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://localhost:{port}", seen
    finally:
        await runner.cleanup()


async def test_cookies_an_upstream_sets_reach_the_caller_and_never_the_next_call(
    cookie_setting_upstream: tuple[str, list[str | None]],
) -> None:
    base_url, seen = cookie_setting_upstream
    pool = UpstreamPool(connect_timeout_s=5, read_timeout_s=5, max_connections=4, idle_s=4)
    try:
        for call in (1, 2, 3):
            answer = await pool.request("POST", base_url, "/v1/chat/completions", [], b"{}")
            # The caller gets the upstream's Set-Cookie as sent (bytes pass through).
            assert answer.header(b"set-cookie") == f"__cf_bm=call-{call}; Path=/; HttpOnly".encode()
            assert await answer.read() == b'{"ok": true}'
            answer.release()
    finally:
        await pool.aclose()
    assert seen == [None, None, None]


async def test_the_control_plane_client_keeps_no_cookie_either(
    cookie_setting_upstream: tuple[str, list[str | None]],
) -> None:
    base_url, seen = cookie_setting_upstream
    async with control_client() as client:
        for call in (1, 2, 3):
            answer = await client.get(f"{base_url}/v1/fine_tuning/jobs")
            assert answer.headers["set-cookie"] == f"__cf_bm=call-{call}; Path=/; HttpOnly"
    assert seen == [None, None, None]


async def test_relayed_answers_keep_a_header_sent_twice_as_two(
    cookie_setting_upstream: tuple[str, list[str | None]],
) -> None:
    base_url, _ = cookie_setting_upstream
    async with control_client() as client:

        async def forward(request: Request) -> Response:
            return await relay(client, request, base_url, "scheduler")

        gateway = Starlette(routes=[Route("/v1/fine_tuning/{rest:path}", forward)])
        transport = httpx.ASGITransport(app=gateway)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as caller:
            answer = await caller.get("/v1/fine_tuning/two-cookies")
    assert answer.status_code == 200
    assert answer.headers.get_list("set-cookie") == [
        "a=1; Expires=Wed, 09 Jun 2027 10:18:14 GMT",
        "b=2; Path=/",
    ]
    assert answer.json() == {"ok": True}

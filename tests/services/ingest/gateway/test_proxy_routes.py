"""The gateway's one route table: what the fast path dispatches is what OpenAPI documents, call
for call, and every call is served and counted as its table entry says."""

from __future__ import annotations

import re
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from starlette.types import Message, Receive, Scope, Send

from services.ingest.api import router
from services.ingest.gateway.fastpath import ProxyEndpoints, answers
from services.ingest.gateway.reading import gemini_method
from services.ingest.gateway.routes import GEMINI_ACTIONS, ROUTES, ProxyRoute, RouteTable

PROXY_TAGS = {"gateway", "otlp"}
# What each template parameter stands for in a real call (model ids hold colons: ft:<base>:...).
SAMPLE_PARAMS = {
    "model": "ft:smol:acme:job-1",
    "model_action": "gemini-2.5-flash:generateContent",
    "response_id": "resp_1",
}
# Calls that look like provider calls and are not the gateway's: the hoster's /v1/models
# (relayed by FastAPI), an unknown Gemini action under /v1, a method a path does not take.
NOT_PROXIED = [
    ("GET", "/v1/models/ft:smol:acme:job-1"),
    ("POST", "/v1/models/gemini-2.5-flash:explode"),
    ("GET", "/v1/chat/completions"),
    ("POST", "/v1/responses/resp_1/input_items"),
    ("GET", "/v1beta/models/gemini-2.5-flash:generateContent"),
]


def _app() -> FastAPI:
    app = FastAPI()
    app.include_router(router)
    return app


def _filled(template: str, fill: dict[str, str]) -> str:
    return re.sub(r"\{(\w+)(?::\w+)?\}", lambda m: fill.get(m.group(1), "x"), template)


def _documented(app: FastAPI) -> Iterator[tuple[str, str, set[str]]]:
    for path, operations in app.openapi()["paths"].items():
        for method, operation in operations.items():
            yield method.upper(), path, set(operation.get("tags", []))


def test_the_documented_gateway_is_the_route_table() -> None:
    documented = {(m, p) for m, p, tags in _documented(_app()) if tags & PROXY_TAGS}
    assert documented == {(route.method, route.template) for route in ROUTES.routes}


def test_no_route_fastapi_serves_is_taken_by_the_fast_path() -> None:
    app = _app()
    for method, template, tags in _documented(app):
        if tags & PROXY_TAGS:
            continue
        path = _filled(template, {})
        assert not answers(method, path), (method, template)
    for method, path in NOT_PROXIED:
        assert not answers(method, path), (method, path)


def test_a_gemini_routes_capture_is_its_actions() -> None:
    for route in ROUTES.routes:
        if route.family != "gemini" or route.capture == "by_action":
            continue
        model, captured = gemini_method(_filled(route.template, SAMPLE_PARAMS).rpartition("/")[2])
        assert (model, captured) == ("ft:smol:acme:job-1", route.capture == "captured")
    assert {r.template for r in ROUTES.routes if r.family == "gemini"} == {
        "/v1beta/models/{model_action}",
        *(f"/v1/models/{{model}}:{action}" for action in GEMINI_ACTIONS),
    }


def test_a_template_matches_one_path_segment_per_parameter() -> None:
    table = RouteTable([ProxyRoute("GET", "/a/{id}/b", "openai", "relayed", name="n", summary="")])
    assert table.match("GET", "/a/1/b") is not None
    assert table.match("GET", "/a/1:2.x/b") is not None
    for path in ("/a//b", "/a/1/2/b", "/a/1/b/", "/a/1/bb", "/xa/1/b"):
        assert table.match("GET", path) is None, path
    assert table.match("POST", "/a/1/b") is None
    with pytest.raises(ValueError, match="twice"):
        RouteTable([*table.routes, *table.routes])


class Recorded(ProxyEndpoints):
    """Proxy endpoints that note each call and the FastAPI route it came through, and answer 204."""

    def __init__(self) -> None:  # no gateway: nothing is proxied here
        self.calls: list[tuple[str, str, str]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.calls.append((scope["method"], scope["path"], scope["route"].path))
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})


def test_each_proxied_call_reaches_the_route_documented_for_it_and_is_served_alike() -> None:
    # One call per table entry, and an unknown Gemini action on /v1beta (still Gemini's route:
    # the gateway answers it with Gemini's 404). Routed by FastAPI itself (no ProxyRoutes in
    # front), each reaches the route documented under its template, which hands it to the same
    # ProxyEndpoints the fast path serves it with.
    calls = [(r.method, _filled(r.template, SAMPLE_PARAMS)) for r in ROUTES.routes]
    calls.append(("POST", "/v1beta/models/gemini-2.5-flash:explode"))
    app = _app()
    app.state.proxy_endpoints = endpoints = Recorded()
    with TestClient(app) as client:
        for method, path in calls:
            assert client.request(method, path, content=b"{}").status_code == 204, path
    templates = []
    for method, path in calls:
        route = ROUTES.match(method, path)
        assert route is not None, (method, path)
        templates.append(route.template)
    assert endpoints.calls == [(m, p, t) for (m, p), t in zip(calls, templates, strict=True)]


class FakeGateway:
    def __init__(self) -> None:
        self.served: list[dict[str, Any]] = []

    async def serve(self, scope: Scope, receive: Receive, send: Send, **how: Any) -> None:
        self.served.append(how)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})


async def test_each_call_is_served_and_counted_as_its_table_entry_says() -> None:
    gateway, added = FakeGateway(), []
    telemetry = SimpleNamespace(
        service_name="ingest", requests=SimpleNamespace(add=lambda n, attrs: added.append(attrs))
    )

    async def traces(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    endpoints = ProxyEndpoints(gateway, telemetry, traces)  # type: ignore[arg-type]

    async def receive() -> Message:
        return {"type": "http.request", "body": b"{}"}

    async def send(message: Message) -> None:
        pass

    for method, path in [
        ("POST", "/v1/chat/completions"),
        ("GET", "/v1/responses/resp_1"),
        ("POST", "/v1/models/ft:smol:acme:job-1:countTokens"),
        ("POST", "/v1/traces"),
    ]:
        await endpoints({"type": "http", "method": method, "path": path}, receive, send)
    endpoints.flush()
    assert gateway.served == [
        {"api": "openai", "path": "/v1/chat/completions", "capture": True, "model_optional": False},
        {"api": "openai", "path": "/v1/responses/resp_1", "capture": False, "model_optional": True},
        {"api": "gemini", "path": "/v1/models/ft:smol:acme:job-1:countTokens",
         "model": "ft:smol:acme:job-1", "capture": False},
    ]  # fmt: skip
    # Counted by method and template: a stored response's GET is a GET, its id left out.
    assert [(a["method"], a["route"], a["status"]) for a in added] == [
        ("POST", "/v1/chat/completions", "200"),
        ("GET", "/v1/responses/{response_id}", "200"),
        ("POST", "/v1/models/{model}:countTokens", "200"),
        ("POST", "/v1/traces", "200"),
    ]

"""The gateway's one route table: every provider call it proxies and the OTLP trace export.

fastpath.py dispatches from it ahead of FastAPI, documented.py generates the OpenAPI documentation of
the same calls from it, and the request counter labels them with its templates; a proxied path
that is not in `ROUTES` is neither served nor documented.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from services.ingest.gateway.routing import Api
from services.ingest.normalize import RESPONSES_PATH

# The API family whose upstreams serve a call and whose error shape refuses it; "otlp" is the
# trace receiver, which has no upstream.
Family = Literal["openai", "anthropic", "gemini", "otlp"]
# Whether an answered call becomes a sample. "by_action": Gemini's `<model>:<action>` path
# segment decides, as GEMINI_ACTIONS says.
Capture = Literal["captured", "relayed", "by_action"]

# Gemini names the model and the action in the path: whether each action's calls are captured
# (the rest are not conversations). Any other action gets Gemini's own 404.
GEMINI_ACTIONS: dict[str, bool] = {
    "generateContent": True,
    "streamGenerateContent": True,
    "countTokens": False,
    "embedContent": False,
    "batchEmbedContents": False,
}
_PARAM = re.compile(r"\{(\w+)\}")


@dataclass(frozen=True, slots=True)
class ProxyRoute:
    """One proxied call: how it is matched, served, counted and documented."""

    method: str
    # The path, with `{name}` for a path segment's worth of characters (no "/"): the OpenAPI
    # path, and the `route` label its calls are counted under in http_server_requests_total.
    template: str
    family: Family
    capture: Capture
    # The OpenAPI operation's name, which its operationId is made from (kept stable for the
    # client generators that name methods after it).
    name: str
    summary: str
    description: str = ""
    # Whether the body may name no model: then the call goes to the family's first upstream.
    model_optional: bool = False
    params: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", tuple(_PARAM.findall(self.template)))

    @property
    def api(self) -> Api:
        """The provider API family of a proxied call (not of the OTLP receiver)."""
        if self.family == "otlp":
            raise ValueError(f"{self.method} {self.template} is not a provider call")
        return self.family


class RouteTable:
    """`ProxyRoute`s looked up by method and path: an exact path in two dict lookups (the hot
    calls), a templated one by literal prefix, then pattern, among its method's only."""

    def __init__(self, routes: Iterable[ProxyRoute]) -> None:
        self.routes = tuple(routes)
        keys = [(route.method, route.template) for route in self.routes]
        if len(keys) != len(set(keys)):
            raise ValueError(f"a method and template appear twice in the proxy routes: {keys}")
        self._exact: dict[str, dict[str, ProxyRoute]] = {}
        templated: dict[str, list[tuple[str, re.Pattern[str], ProxyRoute]]] = {}
        for route in self.routes:
            if route.params:
                prefix = route.template.partition("{")[0]
                templated.setdefault(route.method, []).append(
                    (prefix, _pattern(route.template), route)
                )
            else:
                self._exact.setdefault(route.template, {})[route.method] = route
        self._templated = {method: tuple(found) for method, found in templated.items()}

    def match(self, method: str, path: str) -> ProxyRoute | None:
        """The route a request is, or None for a request the gateway does not proxy."""
        by_method = self._exact.get(path)
        if by_method is not None and method in by_method:
            return by_method[method]
        for prefix, pattern, route in self._templated.get(method, ()):
            if path.startswith(prefix) and pattern.fullmatch(path):
                return route
        return None


def _pattern(template: str) -> re.Pattern[str]:
    """The template as a regular expression: each `{name}` one non-empty path segment's worth."""
    literals = _PARAM.split(template)[::2]  # split keeps the names at the odd places
    return re.compile("[^/]+".join(re.escape(literal) for literal in literals))


def _gemini_v1(action: str, captured: bool) -> ProxyRoute:
    # google-genai calls /v1 by default. There a route per action: the rest of /v1/models is
    # the hoster's (relayed), whose model ids hold colons too (ft:<base>:<suffix>:<job>).
    return ProxyRoute(
        "POST",
        f"/v1/models/{{model}}:{action}",
        "gemini",
        "captured" if captured else "relayed",
        name=f"gemini_v1_{action}",
        summary=f"Gemini {action} (API version v1)",
        description="Captured, as on /v1beta." if captured else "Relayed only, not captured.",
    )


def _relayed(path: str, api: Api, summary: str) -> ProxyRoute:
    # Relayed to the model's upstream like the captured calls, not captured: not conversations
    # (embeddings, token counts) or not in a shape the normalisers read (legacy completions).
    # Without them an SDK pointed at the gateway would get a 404 for them.
    return ProxyRoute(
        "POST",
        path,
        api,
        "relayed",
        name="relay_" + path.strip("/").replace("/", "_"),
        summary=summary,
        description=f"Relayed to the model's {api} upstream unchanged; not captured.",
    )


def _stored_response(method: str, tail: str, summary: str) -> ProxyRoute:
    # A response the Responses API stored names no model: its id is in the path.
    return ProxyRoute(
        method,
        f"{RESPONSES_PATH}/{{response_id}}{tail}",
        "openai",
        "relayed",
        name="stored_response",
        summary=f"Responses: {summary}",
        description="A response the Responses API stored: relayed, not captured, to the first "
        "OpenAI upstream in the upstreams file (the call names no model).",
        model_optional=True,
    )


ROUTES = RouteTable(
    (
        ProxyRoute(
            "POST",
            "/v1/chat/completions",
            "openai",
            "captured",
            name="openai_chat_completions",
            summary="OpenAI Chat Completions, proxied and captured",
        ),
        ProxyRoute(
            "POST",
            RESPONSES_PATH,
            "openai",
            "captured",
            name="openai_responses",
            summary="OpenAI Responses, proxied and captured",
        ),
        ProxyRoute(
            "POST",
            "/v1/messages",
            "anthropic",
            "captured",
            name="anthropic_messages",
            summary="Anthropic Messages, proxied and captured",
        ),
        ProxyRoute(
            "POST",
            "/v1beta/models/{model_action}",
            "gemini",
            "by_action",
            name="gemini_generate",
            summary="Gemini generateContent / streamGenerateContent",
            description="generateContent and streamGenerateContent are captured; "
            "countTokens, embedContent and batchEmbedContents are relayed only.",
        ),
        *(_gemini_v1(action, captured) for action, captured in GEMINI_ACTIONS.items()),
        _relayed("/v1/embeddings", "openai", "OpenAI embeddings, relayed"),
        _relayed("/v1/completions", "openai", "OpenAI legacy completions, relayed"),
        _relayed("/v1/messages/count_tokens", "anthropic", "Anthropic token counting, relayed"),
        _stored_response("GET", "", "retrieve"),
        _stored_response("DELETE", "", "delete"),
        _stored_response("GET", "/input_items", "input items"),
        _stored_response("POST", "/cancel", "cancel"),
        ProxyRoute(
            "POST",
            "/v1/moderations",
            "openai",
            "relayed",
            name="moderations",
            summary="OpenAI moderations, relayed",
            description="Relayed, not captured: to the model's upstream, or without a "
            "model to the first OpenAI upstream in the upstreams file.",
            model_optional=True,
        ),
        ProxyRoute(
            "POST",
            "/v1/traces",
            "otlp",
            "captured",
            name="otlp_traces",
            summary="OTLP/HTTP trace export (protobuf or JSON, gzip)",
            description="OTLP/HTTP `ExportTraceServiceRequest`s, answered with an "
            "`ExportTraceServiceResponse` (partial success for rejected spans) or a "
            "`google.rpc.Status`.",
        ),
    )
)

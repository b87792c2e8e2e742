"""What GatewayProtocol takes from uvicorn's private modules, checked before the service serves.

GatewayProtocol (protocol.py) subclasses uvicorn's httptools protocol and repeats part of
its `on_headers_complete`, so it relies on names uvicorn does not promise to keep. `http_protocol`
hands it to uvicorn only when the installed uvicorn is of the series the contract test checked
(tests/services/ingest/gateway/test_gateway_protocol_contract.py) and still has those names with the
parameters it passes. Otherwise it logs a warning naming the uvicorn version and gives uvicorn's
own protocol: the ProxyRoutes middleware then serves the proxied calls, as correctly, for about a
tenth more CPU per call and a second socket send per answer (docs/ingest.md).
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import logging
from typing import Literal

import uvicorn

log = logging.getLogger("tuneloop.ingest.gateway_protocol")

# The uvicorn minor series the contract test was run against; pyproject pins a version of it.
CHECKED_SERIES = "0.55"
_HTTPTOOLS_IMPL = "uvicorn.protocols.http.httptools_impl"
# Each private callable GatewayProtocol calls or overrides, and its parameters, in order: the
# ones it passes (positionally to HttpToolsProtocol, by name to RequestResponseCycle) and no more.
CALLABLES: dict[str, tuple[str, ...]] = {
    f"{_HTTPTOOLS_IMPL}:HttpToolsProtocol.__init__": (
        "self", "config", "server_state", "app_state", "_loop",
    ),
    f"{_HTTPTOOLS_IMPL}:HttpToolsProtocol.on_headers_complete": ("self",),
    f"{_HTTPTOOLS_IMPL}:HttpToolsProtocol._start_asgi_task": ("self", "cycle", "app"),
    f"{_HTTPTOOLS_IMPL}:HttpToolsProtocol.on_response_complete": ("self",),
    f"{_HTTPTOOLS_IMPL}:RequestResponseCycle.__init__": (
        "self", "scope", "transport", "flow", "logger", "access_logger", "access_log",
        "default_headers", "message_event", "expect_100_continue", "keep_alive", "on_response",
    ),
    f"{_HTTPTOOLS_IMPL}:RequestResponseCycle.send": ("self", "message"),
    "httptools:HttpRequestParser.get_method": ("self",),
    "httptools:HttpRequestParser.get_http_version": ("self",),
    "httptools:HttpRequestParser.should_upgrade": ("self",),
    "httptools:HttpRequestParser.should_keep_alive": ("self",),
}  # fmt: skip
# The other names it imports or calls (signatures that are not Python's to inspect).
NAMES = (
    "uvicorn._types:ASGISendEvent",
    "uvicorn.config:Config",
    "uvicorn.server:ServerState",
    "httptools:parse_url",
)

# What it reads of the protocol's and the cycle's state (checked on instances by the test).
PROTOCOL_ATTRIBUTES = (
    "app", "parser", "cycle", "url", "scope", "root_path", "limit_concurrency", "transport",
    "flow", "logger", "access_logger", "access_log", "server_state", "expect_100_continue",
)  # fmt: skip
CYCLE_ATTRIBUTES = ("response_started", "response_complete", "transport")
# The uvicorn methods whose code it repeats in part (on_headers_complete, after
# on_message_begin's scope) or wraps (send, whose writes it collects by swapping the transport,
# so send must only write, close and ask is_closing): a change to any of them is to be re-read
# against GatewayProtocol. The test pins a fingerprint of each one's source.
REPEATED = (
    f"{_HTTPTOOLS_IMPL}:HttpToolsProtocol.on_message_begin",
    f"{_HTTPTOOLS_IMPL}:HttpToolsProtocol.on_headers_complete",
    f"{_HTTPTOOLS_IMPL}:RequestResponseCycle.send",
)


def contract_problems() -> list[str]:
    """What keeps GatewayProtocol from being used with the installed uvicorn; empty if nothing."""
    problems: list[str] = []
    if not uvicorn.__version__.startswith(f"{CHECKED_SERIES}."):
        problems.append(f"GatewayProtocol was checked against uvicorn {CHECKED_SERIES}.x only")
    for spec in NAMES:
        try:
            _resolve(spec)
        except (ImportError, AttributeError) as exc:
            problems.append(f"{spec} is gone ({exc})")
    for spec, expected in CALLABLES.items():
        problem = _signature_problem(spec, expected)
        if problem is not None:
            problems.append(problem)
    return problems


def http_protocol() -> type[asyncio.Protocol] | Literal["httptools"]:
    """The HTTP protocol class for uvicorn: GatewayProtocol, or, when the installed uvicorn
    breaks its contract, uvicorn's own (logged as a warning; runs before the service's logging
    is set up, so the line reaches stderr through Python's last-resort handler)."""
    problems = contract_problems()
    if not problems:
        try:  # imported only now: it imports the private modules at its top
            from services.ingest.gateway.protocol import GatewayProtocol
        except ImportError as exc:
            problems = [f"services.ingest.gateway.protocol does not import ({exc})"]
        else:
            return GatewayProtocol
    log.warning(
        "uvicorn %s: %s. Serving with uvicorn's own httptools protocol instead of "
        "GatewayProtocol: the ProxyRoutes middleware answers the proxied calls (correct, about a "
        "tenth more CPU per call)",
        uvicorn.__version__,
        "; ".join(problems),
    )
    return "httptools"


def _resolve(spec: str) -> object:
    """`module:Attr.attr` -> the object; ImportError or AttributeError when it is not there."""
    module_name, _, attributes = spec.partition(":")
    found: object = importlib.import_module(module_name)
    for attribute in attributes.split("."):
        found = getattr(found, attribute)
    return found


def _signature_problem(spec: str, expected: tuple[str, ...]) -> str | None:
    try:
        found = _resolve(spec)
    except (ImportError, AttributeError) as exc:
        return f"{spec} is gone ({exc})"
    try:
        parameters = tuple(inspect.signature(found).parameters)  # type: ignore[arg-type]
    except (TypeError, ValueError):  # a C method without a signature: its name is enough
        return None
    if parameters != expected:
        return f"{spec} takes {parameters}, GatewayProtocol expects {expected}"
    return None

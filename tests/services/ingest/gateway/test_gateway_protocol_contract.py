"""GatewayProtocol's contract with uvicorn's private modules: what it subclasses, calls, reads and
repeats is still there as it was checked (uvicorn 0.55), so an upgrade that breaks it fails here,
loudly; and a service started on a uvicorn that breaks it serves through the ProxyRoutes
middleware instead, with a warning naming the version."""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import logging
import re
import sys
import tomllib
from pathlib import Path
from typing import Any

import httptools
import pytest
import uvicorn
from fastapi import FastAPI
from uvicorn.config import Config
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from uvicorn.server import ServerState

from services.ingest.gateway import protocol_contract as contract
from services.ingest.gateway.fastpath import ProxyRoutes
from services.ingest.gateway.protocol import GatewayProtocol
from tests.services.ingest.gateway.test_gateway_protocol import (
    ANSWER,
    Recorded,
    Scripted,
    answered,
    post,
)

ROOT = Path(__file__).resolve().parents[4]
# sha256 (first 16 hex digits) of the source of each method in contract.REPEATED, as read
# against GatewayProtocol for uvicorn 0.55.0.
FINGERPRINTS = {
    "HttpToolsProtocol.on_message_begin": "96d377fdc7c2baef",
    "HttpToolsProtocol.on_headers_complete": "1ea8589acfad92d8",
    "RequestResponseCycle.send": "abdd8601b326a8da",
}


def test_the_installed_uvicorn_has_every_name_and_signature_gateway_protocol_uses() -> None:
    assert contract.contract_problems() == []
    assert contract.http_protocol() is GatewayProtocol


def test_pyproject_pins_the_uvicorn_the_contract_was_checked_against() -> None:
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    [pin] = [d for d in dependencies if re.match(r"uvicorn\b", d)]
    exact = re.fullmatch(r"uvicorn(\[[\w,]+\])?==([\w.]+)", pin)
    assert exact, f"{pin!r}: pin one uvicorn version; GatewayProtocol relies on its internals"
    assert exact[2].startswith(f"{contract.CHECKED_SERIES}."), (
        f"uvicorn {exact[2]} is pinned but the contract was checked for {contract.CHECKED_SERIES}:"
        " re-read GatewayProtocol against it, then update CHECKED_SERIES and FINGERPRINTS"
    )
    assert uvicorn.__version__ == exact[2]


def test_what_gateway_protocol_repeats_of_uvicorn_is_unchanged() -> None:
    found = {
        spec.rpartition(":")[2]: hashlib.sha256(
            inspect.getsource(contract._resolve(spec)).encode()  # type: ignore[arg-type]
        ).hexdigest()[:16]
        for spec in contract.REPEATED
    }
    assert found == FINGERPRINTS, (
        "uvicorn changed code GatewayProtocol repeats or wraps: re-read "
        "services/ingest/gateway/protocol.py against it, then update FINGERPRINTS"
    )


async def test_the_protocol_and_the_cycle_have_the_state_gateway_protocol_reads() -> None:
    app = FastAPI()
    config = Config(app=app, http=GatewayProtocol, log_config=None)
    protocol = HttpToolsProtocol(config, ServerState(), app_state={})
    transport = Recorded()
    protocol.connection_made(transport)  # type: ignore[arg-type]
    protocol.data_received(b"POST /v1/chat/completions?x=1 HTTP/1.1\r\nhost: gw\r\n")  # head open
    missing = [a for a in contract.PROTOCOL_ATTRIBUTES if not hasattr(protocol, a)]
    assert missing == []
    assert isinstance(protocol.parser, httptools.HttpRequestParser)
    assert protocol.url == b"/v1/chat/completions?x=1"
    assert protocol.scope["type"] == "http"
    assert protocol.cycle is None
    assert isinstance(protocol.server_state.default_headers, list)
    cycle = RequestResponseCycle(
        scope=protocol.scope, transport=transport, flow=FlowControl(transport),  # type: ignore[arg-type]
        logger=protocol.logger, access_logger=protocol.access_logger, access_log=False,
        default_headers=[], message_event=asyncio.Event(), expect_100_continue=False,
        keep_alive=True, on_response=lambda: None,
    )  # fmt: skip
    assert [a for a in contract.CYCLE_ATTRIBUTES if not hasattr(cycle, a)] == []
    assert (cycle.response_started, cycle.response_complete) == (False, False)


def _warned(caplog: pytest.LogCaptureFixture) -> str:
    with caplog.at_level(logging.WARNING, logger=contract.log.name):
        assert contract.http_protocol() == "httptools"
    [record] = [r for r in caplog.records if r.name == contract.log.name]
    assert record.levelno == logging.WARNING
    return record.getMessage()


def test_an_unchecked_uvicorn_version_falls_back_to_the_middleware_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(uvicorn, "__version__", "0.99.1")
    message = _warned(caplog)
    assert message.startswith("uvicorn 0.99.1: ")
    assert "checked against uvicorn 0.55.x only" in message
    assert "ProxyRoutes middleware" in message


def test_a_missing_private_module_falls_back_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "uvicorn.protocols.http.httptools_impl", None)
    message = _warned(caplog)
    assert f"uvicorn {uvicorn.__version__}: " in message
    assert "HttpToolsProtocol.__init__ is gone" in message


def test_a_changed_signature_falls_back_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def new_init(self: Any, scope: Any, transport: Any, *, on_response: Any) -> None: ...

    monkeypatch.setattr(RequestResponseCycle, "__init__", new_init)
    message = _warned(caplog)
    assert "RequestResponseCycle.__init__ takes ('self', 'scope', 'transport', 'on_response')" in (
        message
    )


async def test_uvicorns_own_protocol_serves_the_proxied_calls_through_the_middleware() -> None:
    # What the fallback gives up: only the shortcut. The call still reaches the proxy endpoints,
    # through the app's middleware, in two sends (head, then body) instead of one.
    app, endpoints = FastAPI(), Scripted()
    app.add_middleware(ProxyRoutes, endpoints=endpoints)
    protocol = HttpToolsProtocol(Config(app=app, log_config=None), ServerState(), app_state={})
    transport = Recorded()
    protocol.connection_made(transport)  # type: ignore[arg-type]
    protocol.data_received(post("/v1/chat/completions"))
    written = await answered(transport, 1)
    assert endpoints.paths == ["/v1/chat/completions"]
    assert written.endswith(ANSWER)
    assert len(transport.writes) == 2

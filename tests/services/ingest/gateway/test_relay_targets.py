"""The path a caller sends reaches the next server as the caller wrote it, or not at all: through a
real ingest process to the fake provider (stored-response calls) and to a bare HTTP server in the
hoster's place (the relayed control-plane routes), which records the request line as it arrived.
And where the relays go: TUNELOOP_INGEST_{SCHEDULER,EVALUATOR,HOSTER}_URL, else the bind host."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from services.ingest.config import IngestSettings, OtherService
from shared import db
from shared.dev import localstack
from shared.settings import Settings
from tests.fakes.raw_http import RawRecorder
from tests.fakes.upstream import RunningUpstream, gateway_env
from tests.plugins.infra import RunningProcess, free_port, make_settings
from tests.plugins.tenants import tenant_key
from tests.services.ingest.conftest import Edge

# Another address than the tests' bind host (127.0.0.1), as another machine or pod would be.
ELSEWHERE = "127.0.0.2"
RELAYED: tuple[OtherService, ...] = ("scheduler", "evaluator", "hoster")

# A response id that, decoded into the request line, would end it and start a header line.
INJECTED = "resp_1%0D%0Ax-injected:%20yes"


@pytest.fixture
def hoster(edge: Edge) -> Iterator[RawRecorder]:
    settings = edge.settings
    with RawRecorder(settings.app.bind_host, settings.services.port_of("hoster")) as recorder:
        yield recorder


def _call(edge: Edge, method: str, path: str) -> httpx.Response:
    # httpx sends a path's percent escapes as they are written.
    return httpx.request(method, edge.url + path, headers={"Authorization": f"Bearer {edge.key}"})


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", f"/v1/responses/{INJECTED}"),
        ("DELETE", f"/v1/responses/{INJECTED}"),
        ("GET", f"/v1/responses/{INJECTED}/input_items"),
        ("POST", f"/v1/responses/{INJECTED}/cancel"),
    ],
)
def test_a_line_break_in_a_response_id_never_reaches_the_provider(
    edge: Edge, method: str, path: str
) -> None:
    before = len(edge.upstream.received)
    refused = _call(edge, method, path)
    assert refused.status_code == 400, refused.text
    assert INJECTED in refused.json()["error"]["message"]  # the path, named as it was sent
    assert edge.upstream.received[before:] == []


def test_an_odd_response_id_reaches_the_provider_percent_encoded_as_sent(edge: Edge) -> None:
    answer = _call(edge, "GET", "/v1/responses/resp_%C2%A4%2A%3A1")
    assert answer.status_code == 200, answer.text
    seen = edge.upstream.received[-1]
    assert seen.target == b"/v1/responses/resp_%C2%A4%2A%3A1"
    assert seen.headers["authorization"] == "Bearer sk-upstream-openai-0123456789"


@pytest.mark.parametrize(
    "path",
    [
        "/v1/models/%2A%06%C2%A4",  # what schemathesis found: a 500 before
        "/v1/models/ft:x%09y%7F",
        "/v1/fine_tuning/jobs/%00",
        "/v1/models/%2E%2E/%2E%2E/v1/admin/tenants",  # a relay must not climb out of /v1/models
        "/v1/models/x%20y",
    ],
)
@pytest.mark.parametrize("method", ["GET", "DELETE", "POST"])
def test_a_relayed_path_with_control_characters_or_dot_segments_is_refused(
    edge: Edge, hoster: RawRecorder, method: str, path: str
) -> None:
    refused = _call(edge, method, path)
    assert refused.status_code == 400, refused.text
    assert path in refused.json()["detail"]
    assert hoster.received == []


@pytest.mark.parametrize("method", ["GET", "DELETE", "POST"])
def test_a_line_break_in_a_relayed_path_never_reaches_the_service(
    edge: Edge, hoster: RawRecorder, method: str
) -> None:
    # A decoded line break matches no route (a path parameter stops at one): 404, not relayed.
    refused = _call(edge, method, f"/v1/models/ft:{INJECTED}")
    assert refused.status_code in (400, 404), refused.text
    assert hoster.received == []


def test_non_ascii_in_a_relayed_path_reaches_the_service_percent_encoded_as_sent(
    edge: Edge, hoster: RawRecorder
) -> None:
    for method in ("GET", "DELETE", "POST"):
        answer = _call(edge, method, "/v1/models/%2A%C2%A4?after=%C3%A9+x")
        assert answer.status_code == 200, answer.text
        assert answer.json()["id"] == "recorded"
    assert [seen.request_line for seen in hoster.received] == [
        f"{method} /v1/models/%2A%C2%A4?after=%C3%A9+x HTTP/1.1".encode()
        for method in ("GET", "DELETE", "POST")
    ]
    assert all(b"x-injected" not in seen.header_names for seen in hoster.received)


# --- relay targets from settings --------------------------------------------------------------


@dataclass
class Moved:
    url: str
    key: str
    # Each service's stand-in at its configured URL, and at the bind host's port (the default).
    configured: dict[OtherService, RawRecorder]
    at_bind_host: dict[OtherService, RawRecorder]


@pytest.fixture(scope="module")
def moved(
    nats_server: RunningProcess,
    s3_server: RunningProcess,
    stack_settings: Settings,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Moved]:
    """An ingest process whose scheduler, evaluator and hoster are on another address."""
    tmp = tmp_path_factory.mktemp("moved")
    settings = make_settings(tmp, infra=stack_settings)
    db.migrate(settings.database_url)
    host = settings.app.bind_host
    configured = {name: RawRecorder(ELSEWHERE, free_port()) for name in RELAYED}
    at_bind_host = {name: RawRecorder(host, settings.services.port_of(name)) for name in RELAYED}
    with RunningUpstream() as upstream:
        for recorder in [*configured.values(), *at_bind_host.values()]:
            recorder.__enter__()
        env = gateway_env(settings, upstream, tmp) | {
            # A trailing slash is the same base URL.
            f"TUNELOOP_INGEST_{name.upper()}_URL": f"http://{ELSEWHERE}:{recorder.port}/"
            for name, recorder in configured.items()
        }
        process = RunningProcess(
            localstack.component(settings, "ingest"), tmp / "logs" / "ingest.log", env=env
        )
        try:
            process.start()
            url = f"http://127.0.0.1:{settings.services.ingest_port}"
            yield Moved(url, tenant_key(url, "acme"), configured, at_bind_host)
        finally:
            process.stop()
            for recorder in [*configured.values(), *at_bind_host.values()]:
                recorder.__exit__()


def test_the_gateway_relays_to_each_services_configured_url_not_its_bind_host(
    moved: Moved,
) -> None:
    calls = [
        ("GET", "/v1/fine_tuning/jobs?limit=2", "scheduler"),
        ("POST", "/v1/fine_tuning/jobs", "scheduler"),
        ("GET", "/v1/evals", "evaluator"),
        ("GET", "/v1/shadow_scores/support-bot", "evaluator"),
        ("GET", "/v1/models/ft:smol:acme:job-1", "hoster"),
        ("DELETE", "/v1/deployments/dep_1", "hoster"),
    ]
    for method, path, _ in calls:
        answer = httpx.request(
            method,
            moved.url + path,
            headers={"Authorization": f"Bearer {moved.key}", "Content-Type": "application/json"},
            content=b'{"model": "smol"}' if method == "POST" else None,
        )
        assert answer.status_code == 200, (path, answer.text)
        assert answer.json()["id"] == "recorded"
    for name in RELAYED:
        assert [seen.request_line for seen in moved.configured[name].received] == [
            f"{method} {path} HTTP/1.1".encode() for method, path, owner in calls if owner == name
        ], name
        assert moved.at_bind_host[name].received == [], name
    (created,) = (s for s in moved.configured["scheduler"].received if s.body)
    assert created.body == b'{"model": "smol"}'
    assert f"host: {ELSEWHERE}:".encode() in created.head.lower()


@pytest.mark.parametrize("unset", [None, ""])
def test_a_relay_target_defaults_to_the_bind_host_and_its_port(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, unset: str | None
) -> None:
    for name in RELAYED:
        if unset is None:
            monkeypatch.delenv(f"TUNELOOP_INGEST_{name.upper()}_URL", raising=False)
        else:  # set but empty (`${VAR:-}` in Compose): the default too
            monkeypatch.setenv(f"TUNELOOP_INGEST_{name.upper()}_URL", unset)
    own = IngestSettings()
    ports: dict[str, object] = {f"{name}_port": 9000 + i for i, name in enumerate(RELAYED)}
    for bind_host, expected in [
        ("10.0.0.7", "10.0.0.7"),
        ("0.0.0.0", "127.0.0.1"),  # noqa: S104 - every address: reached on the loopback
        ("::1", "[::1]"),
    ]:
        settings = make_settings(tmp_path, app={"bind_host": bind_host}, services=ports)
        assert {name: own.service_url(name, settings) for name in RELAYED} == {
            name: f"http://{expected}:{9000 + i}" for i, name in enumerate(RELAYED)
        }


@pytest.mark.parametrize("value", ["tuneloop-hoster:8403", "ftp://hoster", "http://", " "])
def test_a_relay_target_that_is_not_an_http_url_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("TUNELOOP_INGEST_HOSTER_URL", value)
    with pytest.raises(ValidationError, match="hoster_url"):
        IngestSettings()

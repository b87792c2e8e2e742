"""The path a caller sends reaches the next server as the caller wrote it, or not at all: through a
real ingest process to the fake provider (stored-response calls) and to a bare HTTP server in the
hoster's place (the relayed control-plane routes), which records the request line as it arrived."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.fakes.raw_http import RawRecorder
from tests.services.ingest.conftest import Edge

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

"""The ingest process's JSON routes: the key is checked before the body is read, and a body over
TUNELOOP_MAX_JSON_BODY_BYTES gets 413 (declared or chunked) before it is parsed."""

from __future__ import annotations

import json
from collections.abc import Iterable

import httpx
import pytest

from shared.settings import AppSettings
from tests.plugins.tenants import ADMIN
from tests.raw_socket import chunked, json_of, raw_post, status_of
from tests.services.ingest.conftest import Edge

LIMIT = AppSettings().max_json_body_bytes
JSON = {"content-type": "application/json"}
BEGUN = b'{"name": "big", "base_model": "'


def _post(edge: Edge, path: str, headers: dict[str, str], chunks: Iterable[bytes]) -> bytes:
    return raw_post("127.0.0.1", edge.settings.services.ingest_port, path, headers, chunks)


@pytest.mark.parametrize(
    ("path", "headers"),
    [
        ("/v1/datasets", {}),
        ("/v1/datasets", {"authorization": "Bearer tl_zzzzzzzz_" + "A" * 43}),
        ("/v1/admin/tenants", {}),
        ("/v1/admin/tenants/acme/api_keys", {"authorization": "Bearer not-the-admin-token"}),
    ],
)
def test_a_json_route_refuses_a_bad_key_before_reading_the_body(
    edge: Edge, path: str, headers: dict[str, str]
) -> None:
    # 2 MiB declared, a few bytes sent: a body read before the key was checked would leave
    # this waiting (and the socket timing out) instead of answering.
    declared = {"content-length": str(2 * 1024**2)}
    answer = _post(edge, path, JSON | declared | headers, [BEGUN])
    assert status_of(answer) == 401, answer[:400]


def test_a_json_body_over_the_limit_gets_413_declared_or_chunked(edge: Edge) -> None:
    key = {"authorization": f"Bearer {edge.key}"}
    detail = f"request body: over the limit of {LIMIT} bytes for this route"
    for path, auth in [("/v1/datasets", key), ("/v1/admin/tenants", ADMIN)]:
        declared = {"content-length": str(LIMIT + 1)}
        answer = _post(edge, path, JSON | declared | auth, [BEGUN])
        assert status_of(answer) == 413, answer[:400]
        assert json_of(answer)["detail"] == detail
    # Chunked, just past the limit and never finished: answered once the limit is passed.
    filler = b"x" * 65536
    chunks = chunked([BEGUN, *[filler] * (LIMIT // len(filler) + 1)], end=False)
    answer = _post(edge, "/v1/datasets", JSON | key | {"transfer-encoding": "chunked"}, chunks)
    assert status_of(answer) == 413, answer[:400]
    assert json_of(answer)["detail"] == detail


def test_a_streamed_import_is_not_held_to_the_json_limit(edge: Edge) -> None:
    # /v1/samples/import reads its body as it arrives, under limits of its own: a body larger
    # than the JSON routes take is imported whole.
    line = json.dumps(
        {
            "messages": [
                {"role": "user", "content": "x" * (256 * 1024)},
                {"role": "assistant", "content": "ok"},
            ]
        }
    ).encode()
    body = (line + b"\n") * (LIMIT // len(line) + 2)
    assert len(body) > LIMIT
    response = httpx.post(
        f"{edge.url}/v1/samples/import",
        content=body,
        headers={"authorization": f"Bearer {edge.key}"},
        timeout=60,
    )
    assert response.status_code == 200, response.text[:400]
    assert response.json()["accepted_lines"] == LIMIT // len(line) + 2

"""Hypothesis-made bad bodies at the gateway's and the OTLP endpoint: never a 5xx. What the
gateway must refuse itself (a body that is not a JSON object, a missing or non-string model, a
model no upstream of the family serves) gets exactly that 4xx with a message; what it can route
goes upstream untouched (the provider judges its own fields); OTLP answers 200 or 400; a
streamed import answers 200 with a report that accounts for every line (bad lines are
rejections named by line number, not a failed request)."""

from __future__ import annotations

import httpx
import orjson
from google.rpc.status_pb2 import Status
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.services.ingest.conftest import Edge

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
)
_json = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=16,
)
_chatty = st.fixed_dictionaries(
    {
        "model": st.sampled_from(
            ["gpt-4o-mini", "claude-3-5-sonnet", "gemini-2.5-flash", "nope", ""]
        )
        | _scalars
    },
    optional={
        "messages": _json,
        "contents": _json,
        "stream": _json,
        "tools": _json,
        "max_tokens": _json,
    },
)
_bodies = st.one_of(st.binary(max_size=200), _json.map(orjson.dumps), _chatty.map(orjson.dumps))
_routes = st.sampled_from(
    [
        ("/v1/chat/completions", "application/json"),
        ("/v1/messages", "application/json"),
        ("/v1beta/models/gemini-2.5-flash:generateContent", "application/json"),
        ("/v1/traces", "application/json"),
        ("/v1/traces", "application/x-protobuf"),
        ("/v1/samples/import", "application/jsonl"),
    ]
)


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(route=_routes, body=_bodies)
def test_bad_bodies_get_a_clear_4xx_never_a_5xx(
    edge: Edge, route: tuple[str, str], body: bytes
) -> None:
    path, content_type = route
    if path == "/v1/samples/import":
        body = body + b"\n" + body  # several lines, some of them whole JSON documents
    forwarded_before = len(edge.upstream.received)
    answer = httpx.post(
        f"{edge.url}{path}",
        content=body,
        headers={"Authorization": f"Bearer {edge.key}", "content-type": content_type},
        timeout=10,
    )
    assert answer.status_code < 500, (answer.status_code, answer.text[:300])
    if path == "/v1/samples/import":
        assert answer.status_code == 200, answer.text[:300]
        report = answer.json()
        counted = report["accepted_lines"] + report["rejected_lines"] + report["blank_lines"]
        assert counted == report["total_lines"]
        assert all(e["line"] >= 1 and e["reason"] for e in report["errors"])
    elif path == "/v1/traces":
        assert answer.status_code in (200, 400), (answer.status_code, answer.text[:300])
    else:
        refusal = _gateway_refusal(path, body)
        if refusal is None:  # routed: the fake upstream got it and answered
            assert len(edge.upstream.received) == forwarded_before + 1
            assert edge.upstream.received[-1].raw == body  # byte for byte
        else:
            assert answer.status_code == refusal, (answer.status_code, answer.text[:300])
            assert len(edge.upstream.received) == forwarded_before  # answered by the gateway
    if answer.status_code >= 400 and answer.headers["content-type"] == "application/x-protobuf":
        assert Status.FromString(answer.content).message, answer.content  # OTLP's failure body
    elif answer.status_code >= 400:
        error = answer.json()
        message = (
            error.get("message") or error.get("error", {}).get("message") or error.get("detail")
        )
        assert message, answer.text


# The fake upstream's families, as the tests' upstreams file routes them (tests/fakes/upstream.py).
_FAMILY_MODELS = {"/v1/chat/completions": ("gpt-", "text-embedding-"), "/v1/messages": ("claude-",)}


def _gateway_refusal(path: str, body: bytes) -> int | None:
    """The status the gateway answers `body` with itself, or None when it goes upstream."""
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError:
        return 400
    if not isinstance(document, dict):
        return 400
    if path not in _FAMILY_MODELS:  # Gemini: the model is in the path
        return None
    model = document.get("model")
    if not isinstance(model, str) or not model:
        return 400
    return None if model.startswith(_FAMILY_MODELS[path]) else 404

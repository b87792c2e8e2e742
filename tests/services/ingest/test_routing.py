"""Routing of calls that name no model: which calls they are, and the upstream they go to (the
whole flow through the gateway and the openai SDK is in test_gateway.py)."""

from __future__ import annotations

import pytest

from services.ingest.fastpath import answers
from services.ingest.gateway import model_optional_call
from services.ingest.routing import RoutingTable, Upstream

OPENAI_A = Upstream("openai", "openai", "https://api.openai.com", ("gpt-*",))
LOCAL = Upstream("local-vllm", "openai", "http://gpu-box:8000", ("llama-*",))
CLAUDE = Upstream("anthropic", "anthropic", "https://api.anthropic.com", ("claude-*",))


@pytest.mark.parametrize(
    ("method", "path", "expected"),
    [
        ("GET", "/v1/responses/resp_1", ("openai", "/v1/responses/{response_id}")),
        ("DELETE", "/v1/responses/resp_1", ("openai", "/v1/responses/{response_id}")),
        ("GET", "/v1/responses/resp_1/input_items", ("openai", "/v1/responses/{response_id}/input_items")),
        ("POST", "/v1/responses/resp_1/cancel", ("openai", "/v1/responses/{response_id}/cancel")),
        ("POST", "/v1/moderations", ("openai", "/v1/moderations")),
        ("POST", "/v1/responses/resp_1", None),  # creating goes to /v1/responses, with a model
        ("GET", "/v1/responses/", None),  # no id
        ("GET", "/v1/responses/resp_1/cancel", None),
        ("POST", "/v1/responses/resp_1/input_items", None),
        ("GET", "/v1/responses/resp_1/input_items/extra", None),
        ("GET", "/v1/moderations", None),
        ("POST", "/v1/chat/completions", None),  # names its model: not this kind of call
    ],
)  # fmt: skip
def test_which_calls_may_name_no_model(
    method: str, path: str, expected: tuple[str, str] | None
) -> None:
    assert model_optional_call(method, path) == expected
    # The gateway takes exactly these (and its usual POSTs) ahead of FastAPI.
    assert answers(method, path) == (expected is not None or path == "/v1/chat/completions")


def test_a_call_without_a_model_goes_to_the_first_upstream_of_its_family() -> None:
    table = RoutingTable([CLAUDE, LOCAL, OPENAI_A])
    first = table.first("openai")
    assert first is not None
    assert first.upstream == "local-vllm"  # the file's order decides, not the patterns
    assert table.first("gemini") is None  # the gateway answers 404 in Gemini's shape
    # A named model is routed by its pattern as before.
    named = table.resolve("openai", "gpt-4.1")
    assert named is not None
    assert named.upstream == "openai"

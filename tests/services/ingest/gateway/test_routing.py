"""Routing of calls that name no model: which calls they are, and the upstream they go to (the
whole flow through the gateway and the openai SDK is in test_gateway.py)."""

from __future__ import annotations

import pytest

from services.ingest.gateway.fastpath import answers
from services.ingest.gateway.routes import ROUTES
from services.ingest.gateway.routing import RoutingTable, Upstream

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
    route = ROUTES.match(method, path)
    optional = (route.family, route.template) if route and route.model_optional else None
    assert optional == expected
    # The gateway takes exactly these (and its usual POSTs) ahead of FastAPI.
    assert answers(method, path) == (expected is not None or path == "/v1/chat/completions")


def test_a_call_without_a_model_goes_to_the_first_upstream_of_its_family() -> None:
    table = RoutingTable([CLAUDE, LOCAL, OPENAI_A])
    first = table.first("openai")
    assert first is not None
    assert first.upstream == "local-vllm"  # the file's order decides, not the patterns
    assert table.first("gemini") is None  # the gateway answers 404 in Gemini's shape
    # A named model is routed by its pattern as before.
    named = table.resolve("openai", "gpt-4.1", "acme")
    assert named is not None
    assert named.upstream == "openai"


def test_a_deployment_serves_only_the_tenant_that_made_it() -> None:
    table = RoutingTable([OPENAI_A])
    table.add_deployment(tenant="acme", served_model_name="gpt-4o", deployment_id="dep-1",
                         endpoint_url="http://gpu-box:9000/")  # fmt: skip
    mine = table.resolve("openai", "gpt-4o", "acme")
    theirs = table.resolve("openai", "gpt-4o", "globex")
    assert mine is not None
    assert theirs is not None
    # The tenant's own deployment shadows the upstreams file for that tenant only.
    assert (mine.upstream, mine.base_url, mine.api_key) == (
        "deployment:dep-1",
        "http://gpu-box:9000",
        None,
    )
    assert (theirs.upstream, theirs.base_url) == ("openai", "https://api.openai.com")
    assert table.resolve("anthropic", "gpt-4o", "acme") is None  # deployments speak OpenAI's API
    # Another tenant's stop event with the same name and id leaves acme's route alone...
    table.remove_deployment(tenant="globex", served_model_name="gpt-4o", deployment_id="dep-2")
    assert table.resolve("openai", "gpt-4o", "acme") == mine
    # ...and acme's own takes it away; a late replayed "ready" of a stopped id does not return it.
    table.remove_deployment(tenant="acme", served_model_name="gpt-4o", deployment_id="dep-1")
    assert table.resolve("openai", "gpt-4o", "acme") == theirs
    table.add_deployment(tenant="acme", served_model_name="gpt-4o", deployment_id="dep-1",
                         endpoint_url="http://gpu-box:9000/")  # fmt: skip
    assert table.resolve("openai", "gpt-4o", "acme") == theirs


def test_a_deployments_route_tags_its_samples_with_the_version_it_serves() -> None:
    table = RoutingTable([OPENAI_A])
    table.add_deployment(tenant="acme", served_model_name="ft:smol:acme:j1", deployment_id="d1",
                         endpoint_url="http://127.0.0.1:9000/v1", version_id="mv-7")  # fmt: skip
    table.add_deployment(tenant="acme", served_model_name="old", deployment_id="d0",
                         endpoint_url="http://127.0.0.1:9001/v1")  # fmt: skip
    route = table.resolve("openai", "ft:smol:acme:j1", "acme")
    assert route is not None
    assert route.tags == ("model_version:mv-7",)
    untagged = table.resolve("openai", "old", "acme")  # a v1-era event without a version
    assert untagged is not None
    assert untagged.tags == ()
    provider = table.resolve("openai", "gpt-4o", "acme")
    assert provider is not None
    assert provider.tags == ()


def test_a_deployed_catalogue_base_is_routed_though_no_upstream_pattern_names_it() -> None:
    table = RoutingTable([OPENAI_A, LOCAL])  # no pattern matches "SmolLM2-135M-Instruct"
    assert table.resolve("openai", "SmolLM2-135M-Instruct", "acme") is None
    table.add_deployment(tenant="acme", served_model_name="SmolLM2-135M-Instruct",
                         deployment_id="dep-base", endpoint_url="http://127.0.0.1:9002/v1")  # fmt: skip
    route = table.resolve("openai", "SmolLM2-135M-Instruct", "acme")
    assert route is not None
    assert (route.upstream, route.tags) == ("deployment:dep-base", ())  # a base: no version tag
    assert table.resolve("openai", "SmolLM2-135M-Instruct", "globex") is None


def test_an_engines_openai_base_url_is_routed_at_its_root() -> None:
    # deployment.ready names the engine's OpenAI base URL (…/v1, as an SDK takes it); the
    # gateway appends the caller's own /v1/... path, so it must route to the root.
    table = RoutingTable([OPENAI_A])
    table.add_deployment(tenant="acme", served_model_name="ft:b::j", deployment_id="dep-9",
                         endpoint_url="http://127.0.0.1:41591/v1")  # fmt: skip
    route = table.resolve("openai", "ft:b::j", "acme")
    assert route is not None
    assert route.base_url == "http://127.0.0.1:41591"


def test_a_re_announced_deployment_is_routed_as_it_is_now_warm_or_cold() -> None:
    # A gateway that starts after the stream dropped the first announcement learns a deployment
    # from the hoster's re-announcement, which says whether it is cold (woken on its next call).
    table = RoutingTable([OPENAI_A])
    table.add_deployment(tenant="acme", served_model_name="ft:b::j", deployment_id="dep-c",
                         endpoint_url="http://127.0.0.1:9003/v1", cold=True)  # fmt: skip
    route = table.resolve("openai", "ft:b::j", "acme")
    assert route is not None
    assert table.is_cold(route)
    # Woken since: the next announcement is of a warm engine.
    table.add_deployment(tenant="acme", served_model_name="ft:b::j", deployment_id="dep-c",
                         endpoint_url="http://127.0.0.1:9004/v1")  # fmt: skip
    route = table.resolve("openai", "ft:b::j", "acme")
    assert route is not None
    assert (table.is_cold(route), route.base_url) == (False, "http://127.0.0.1:9004")

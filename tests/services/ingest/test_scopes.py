"""API key scopes on a running ingest service (real NATS, S3, SQLite; the fake upstream): a read
key gets 403 on every change, route by route, as the apps list them; a tenant's admin key
manages its keys; only an internal key may send x-tuneloop-purpose, whose value tags the
captured sample (both capture modes) and keeps it out of dataset builds unless asked for."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from services.evaluator.app import create_app as evaluator_app
from services.hoster.app import create_app as hoster_app
from services.ingest.api import router as ingest_router
from services.scheduler.app import create_app as scheduler_app
from shared import auth, db
from shared.dev import localstack
from shared.dev.cli import app as cli
from shared.settings import Settings, get_settings
from tests.fakes.upstream import RunningUpstream, gateway_env, recorded
from tests.plugins.infra import RunningProcess, settings_on_private_nats
from tests.plugins.tenants import ADMIN
from tests.services.ingest.conftest import Edge
from tests.services.ingest.datasets.test_datasets_api import post
from tests.services.ingest.datasets.test_datasets_flow import PROMPTS, wait_finished

OPENAI_GATEWAY_ROUTES = (
    "/v1/chat/completions",
    "/v1/responses",
    "/v1/embeddings",
    "/v1/completions",
)
# Routes that take the operator's admin token, not a tenant's key (a tenant key is a 401 there).
ADMIN_TOKEN_ROUTES = re.compile(r"^/v1/admin/")
# Path parameters the routes need to reach their scope check (others get "x").
PATH_VALUES = {"model_action": "m:generateContent"}


def chat() -> dict[str, Any]:
    """A recorded OpenAI request (read when a test runs: a module-level read would stop the
    whole suite's collection on a machine without the fixtures)."""
    body: dict[str, Any] = recorded("oa01_tool_calls_multiturn")["request"]["body"]
    return body


def _issue(edge: Edge, scope: str, tenant: str = "acme") -> dict[str, Any]:
    """A key issued with the operator's admin token."""
    response = httpx.post(
        f"{edge.url}/v1/admin/tenants/{tenant}/api_keys",
        json={"name": f"{scope} key", "scope": scope},
        headers=ADMIN,
    )
    assert response.status_code == 201, response.text
    assert response.json()["scope"] == scope
    issued: dict[str, Any] = response.json()
    return issued


def _key(edge: Edge, scope: str, tenant: str = "acme") -> str:
    return str(_issue(edge, scope, tenant)["key"])


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _calls(app: FastAPI) -> Iterator[tuple[str, str, set[str]]]:
    """(method, path with its parameters filled, tags) of every operation the app documents
    that takes a tenant key: its OpenAPI document lists every route, included routers too."""
    for template, operations in app.openapi()["paths"].items():
        if ADMIN_TOKEN_ROUTES.match(template):
            continue
        path = re.sub(r"\{(\w+)\}", lambda m: PATH_VALUES.get(m.group(1), "x"), template)
        for method, operation in operations.items():
            yield method.upper(), path, set(operation.get("tags", []))


def _ingest_app() -> FastAPI:
    app = FastAPI()
    app.include_router(ingest_router)
    return app


@pytest.fixture(scope="module")
def read_key(edge: Edge) -> str:
    return _key(edge, "read")


@pytest.fixture(scope="module")
def internal_key(edge: Edge) -> str:
    # Not over HTTP (see test_no_http_route_issues_an_internal_key): as the platform does.
    engine = db.make_engine(edge.settings.database_url)
    try:
        with db.session_scope(engine) as session:
            return auth.issue_api_key(session, tenant_id="acme", name="judge", scope="internal")[1]
    finally:
        engine.dispose()


# --- scopes, route by route -------------------------------------------------------------------


def test_a_read_key_gets_403_on_every_change_of_every_ingest_route(
    edge: Edge, read_key: str
) -> None:
    calls = list(_calls(_ingest_app()))
    changes = [(m, p, tags) for m, p, tags in calls if m not in ("GET", "HEAD")]
    assert ("POST", "/v1/files") in [(method, path) for method, path, _ in changes]
    assert ("POST", "/v1/chat/completions") in [(method, path) for method, path, _ in changes]
    for method, path, tags in changes:
        answer = httpx.request(
            method,
            f"{edge.url}{path}",
            headers=_bearer(read_key) | {"content-type": "application/json"},
        )
        assert answer.status_code == 403, (method, path, answer.text)
        assert "scope 'read'" in answer.text, (method, path, answer.text)
        # The SDKs read a code. The API routes: OpenAI's shape beside FastAPI's `detail`; the
        # gateway's OpenAI routes too (Anthropic's and Gemini's speak their own, OTLP its Status).
        openai_shaped = not {"gateway", "otlp"} & tags or path in OPENAI_GATEWAY_ROUTES
        if openai_shaped:
            assert answer.json()["error"]["code"] == "insufficient_scope", (method, path)
    # Reads stay open to it, except the gateway's (provider calls cost money) and the keys'.
    for method, path, tags in calls:
        if method == "GET" and not {"gateway", "keys"} & tags:
            answer = httpx.get(f"{edge.url}{path}", headers=_bearer(read_key))
            assert answer.status_code != 403, (path, answer.text)


@pytest.mark.parametrize("create_app", [scheduler_app, hoster_app, evaluator_app])
def test_a_read_key_gets_403_on_every_change_of_the_other_services(
    edge: Edge, read_key: str, create_app: Any
) -> None:
    # Their resources arrive later; whatever they add must refuse a read key's changes.
    app = create_app(edge.settings)
    calls = list(_calls(app))
    assert ("GET", "/healthz") in [(method, path) for method, path, _ in calls]
    client = TestClient(app)  # no lifespan (no bus): the guards need only app.state's engine
    for method, path, _ in calls:
        if method not in ("GET", "HEAD"):
            answer = client.request(method, path, headers=_bearer(read_key))
            assert answer.status_code == 403, (method, path, answer.text)
            assert answer.json()["error"]["code"] == "insufficient_scope", (method, path)


def test_gateway_calls_need_a_write_or_internal_key(
    edge: Edge, read_key: str, internal_key: str
) -> None:
    reader = openai.OpenAI(base_url=f"{edge.url}/v1", api_key=read_key, max_retries=0)
    with pytest.raises(openai.PermissionDeniedError, match="needs a key with scope 'write' or"):
        reader.chat.completions.create(**chat())
    before = len(edge.upstream.received)

    for key in (edge.key, internal_key):
        client = openai.OpenAI(base_url=f"{edge.url}/v1", api_key=key, max_retries=0)
        assert client.chat.completions.create(**chat()).choices
    assert len(edge.upstream.received) == before + 2


def test_the_relay_refuses_a_read_keys_changes_before_the_owner_is_asked(
    edge: Edge, read_key: str
) -> None:
    refused = httpx.post(f"{edge.url}/v1/fine_tuning/jobs", headers=_bearer(read_key))
    assert refused.status_code == 403
    assert refused.json()["detail"] == (
        "this API key has scope 'read'; POST /v1/fine_tuning/jobs needs a key with scope 'write'"
    )
    # Reads go on to the owner (the scheduler is not running here: 503 naming it).
    read = httpx.get(f"{edge.url}/v1/fine_tuning/jobs", headers=_bearer(read_key))
    assert read.status_code == 503
    assert "scheduler" in read.json()["detail"]


# --- a tenant's own keys ----------------------------------------------------------------------


def test_an_admin_key_manages_its_tenants_keys_and_no_other(edge: Edge) -> None:
    admin = _bearer(_key(edge, "admin"))
    made = httpx.post(
        f"{edge.url}/v1/keys", json={"name": "dashboard", "scope": "read"}, headers=admin
    )
    assert made.status_code == 201, made.text
    issued = made.json()
    assert (issued["tenant"], issued["scope"]) == ("acme", "read")
    assert httpx.get(f"{edge.url}/v1/samples", headers=_bearer(issued["key"])).status_code == 200

    listed = httpx.get(f"{edge.url}/v1/keys", headers=admin).json()["data"]
    assert issued["id"] in [key["id"] for key in listed]
    assert issued["key"] not in str(listed)
    assert all("key_hash" not in key and "key" not in key for key in listed)

    globex = _issue(edge, "write", tenant="globex")
    assert httpx.delete(f"{edge.url}/v1/keys/{globex['id']}", headers=admin).status_code == 404
    assert globex["id"] not in str(listed)
    assert httpx.get(f"{edge.url}/v1/samples", headers=_bearer(globex["key"])).status_code == 200

    revoked = httpx.delete(f"{edge.url}/v1/keys/{issued['id']}", headers=admin)
    assert revoked.status_code == 200
    assert revoked.json()["revoked_at"] is not None


def test_only_admin_keys_see_keys(edge: Edge, read_key: str, internal_key: str) -> None:
    for key in (read_key, edge.key, internal_key):
        answer = httpx.get(f"{edge.url}/v1/keys", headers=_bearer(key))
        assert answer.status_code == 403
        assert "needs a key with scope 'admin'" in answer.json()["detail"]


def test_no_http_route_issues_an_internal_key(edge: Edge) -> None:
    admin = _bearer(_key(edge, "admin"))
    for url, headers in (
        (f"{edge.url}/v1/keys", admin),
        (f"{edge.url}/v1/admin/tenants/acme/api_keys", ADMIN),
    ):
        answer = httpx.post(url, json={"name": "x", "scope": "internal"}, headers=headers)
        assert answer.status_code == 422, answer.text
        assert "scope: 'internal' keys are issued only by" in answer.text


# --- x-tuneloop-purpose -----------------------------------------------------------------------


def test_an_internal_keys_purpose_tags_the_sample_and_never_goes_upstream(
    edge: Edge, internal_key: str
) -> None:
    tag = f"purpose-{uuid.uuid4().hex[:8]}"
    judge = openai.OpenAI(
        base_url=f"{edge.url}/v1",
        api_key=internal_key,
        max_retries=0,
        default_headers={"x-tuneloop-purpose": "judge"},
    )
    judge.chat.completions.create(**chat(), extra_headers={"x-tuneloop-tags": tag})

    assert "x-tuneloop-purpose" not in edge.upstream.received[-1].headers
    [sample] = edge.wait_for_samples(1, tag=tag)
    assert sorted(sample["tags"]) == sorted([tag, "purpose:judge"])
    assert sample["id"] in [s["id"] for s in edge.samples(tag="purpose:judge", limit=1000)]


@pytest.mark.parametrize(
    ("headers", "error", "message"),
    [
        ({"x-tuneloop-purpose": "judge"}, openai.PermissionDeniedError, "x-tuneloop-purpose: only"),
        ({"x-tuneloop-tags": "purpose:judge"}, openai.BadRequestError, "reserved prefix"),
    ],
)
def test_other_keys_cannot_claim_a_purpose(
    edge: Edge, headers: dict[str, str], error: type[Exception], message: str
) -> None:
    client = openai.OpenAI(base_url=f"{edge.url}/v1", api_key=edge.key, max_retries=0)
    before = len(edge.upstream.received)
    with pytest.raises(error, match=message):
        client.chat.completions.create(**chat(), extra_headers=headers)
    assert len(edge.upstream.received) == before


@pytest.mark.parametrize("value", ["Judge", "judge!", "x" * 33, "judge, shadow"])
def test_a_malformed_purpose_is_a_400_naming_the_header(
    edge: Edge, internal_key: str, value: str
) -> None:
    client = openai.OpenAI(base_url=f"{edge.url}/v1", api_key=internal_key, max_retries=0)
    with pytest.raises(openai.BadRequestError, match=r"x-tuneloop-purpose: .* must be one value"):
        client.chat.completions.create(**chat(), extra_headers={"x-tuneloop-purpose": value})


def test_dataset_builds_leave_purposed_samples_out_unless_asked(
    edge: Edge, internal_key: str
) -> None:
    tag = f"mixed-{uuid.uuid4().hex[:8]}"
    user = openai.OpenAI(base_url=f"{edge.url}/v1", api_key=edge.key, max_retries=0)
    judge = openai.OpenAI(base_url=f"{edge.url}/v1", api_key=internal_key, max_retries=0)
    for i, prompt in enumerate(PROMPTS[:7]):
        client, extra = (user, {}) if i < 4 else (judge, {"x-tuneloop-purpose": "judge"})
        client.chat.completions.create(
            **{**chat(), "messages": [{"role": "user", "content": prompt}]},
            extra_headers={"x-tuneloop-tags": tag, **extra},
        )
    edge.wait_for_samples(7, tag=tag)

    selected: dict[tuple[str, ...], int] = {}
    for included in ([], ["judge"]):
        spec = {
            "name": f"purposes-{len(included)}",
            "source": {"tags": [tag], "include_purposes": included},
            "split": {"eval_size": 1},
        }
        answer = post(edge.url, edge.key, spec)
        assert answer.status_code == 202, answer.text
        built = wait_finished(edge.url, edge.key, answer.json()["id"])
        assert built["status"] == "built", built["error"]
        selected[tuple(included)] = built["report"]["input_count"]
    assert selected == {(): 4, ("judge",): 7}


# --- a key from `tuneloop keys create`, through a gateway process of its own ---------------------


def test_capture_carries_the_purpose_of_a_cli_issued_internal_key(
    private_nats: RunningProcess,
    s3_server: RunningProcess,
    stack_settings: Settings,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A NATS of its own: on the session's, the edge's ingest would store this sample (its
    # subscribers share the stream's consumer) in the edge's database.
    settings = settings_on_private_nats(tmp_path / "svc", private_nats, stack_settings)
    with RunningUpstream() as upstream:
        env = gateway_env(settings, upstream, tmp_path)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        get_settings.cache_clear()
        try:
            created = CliRunner().invoke(
                cli, ["keys", "create", "--tenant", "acme", "--scope", "internal"]
            )
        finally:
            get_settings.cache_clear()
        assert created.exit_code == 0, created.output
        [key] = [line for line in created.output.splitlines() if auth.KEY_PATTERN.fullmatch(line)]
        [base_url] = [
            line.removeprefix("base URL: ")
            for line in created.output.splitlines()
            if line.startswith("base URL: ")
        ]
        gateway = RunningProcess(
            localstack.component(settings, "ingest"), tmp_path / "ingest.log", env=env
        )
        gateway.start()
        try:
            client = openai.OpenAI(
                base_url=base_url,
                api_key=key,
                max_retries=0,
                default_headers={"x-tuneloop-purpose": "shadow"},
            )
            client.chat.completions.create(**chat())
            assert "x-tuneloop-purpose" not in upstream.received[-1].headers

            def tagged() -> list[Any]:
                answer = httpx.get(
                    f"{base_url}/samples", params={"tag": "purpose:shadow"}, headers=_bearer(key)
                )
                return list(answer.json()["data"])

            assert localstack.wait_until(lambda: len(tagged()) == 1, 40, interval_s=0.2)
        finally:
            gateway.stop()

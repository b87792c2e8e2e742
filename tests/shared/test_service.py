"""What ServiceRuntime.build_app gives every service's app: the body guard, and an OpenAPI
document whose 422 says what our routes send."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import APIRouter, HTTPException
from fastapi.testclient import TestClient
from pydantic import BaseModel, Field

from shared.auth import PrincipalDep
from shared.service import ServiceRuntime
from tests.plugins.infra import make_settings


class Spec(BaseModel):
    name: str
    weight: float = Field(default=1.0, allow_inf_nan=False)


class ShortSpec(BaseModel):
    name: str = Field(max_length=10)  # checked on the characters: a lone surrogate is refused


def _app(tmp_path: Path) -> TestClient:
    router = APIRouter()

    @router.post("/v1/things")
    def create(spec: Spec) -> dict[str, str]:
        if spec.name == "taken":
            raise HTTPException(422, detail="name: 'taken' is not allowed")
        return {"name": spec.name}

    @router.post("/v1/short")
    def short(spec: ShortSpec) -> dict[str, str]:
        return {"name": spec.name}

    @router.post("/v1/mine")
    def mine(spec: Spec, principal: PrincipalDep) -> dict[str, str]:
        return {"tenant": principal.tenant_id}

    settings = make_settings(tmp_path, app={"max_json_body_bytes": 2048})
    runtime = ServiceRuntime("scheduler", settings)
    # No lifespan: the routes used here need neither the bus nor the database.
    return TestClient(runtime.build_app(router, summary="test"))


def test_every_service_app_caps_json_bodies_and_wants_the_key_first(tmp_path: Path) -> None:
    client = _app(tmp_path)
    assert client.post("/v1/things", json={"name": "a" * 1000}).status_code == 200
    too_big = client.post("/v1/things", json={"name": "a" * 3000})
    assert too_big.status_code == 413
    assert too_big.json() == {"detail": "request body: over the limit of 2048 bytes for this route"}
    # No key: 401 even though the body is over the limit (the key is checked first).
    unauthenticated = client.post("/v1/mine", json={"name": "a" * 3000})
    assert unauthenticated.status_code == 401
    assert "missing API key" in unauthenticated.json()["detail"]


def test_the_documented_422_takes_a_message_or_field_errors(tmp_path: Path) -> None:
    client = _app(tmp_path)
    document: dict[str, Any] = client.get("/openapi.json").json()
    detail = document["components"]["schemas"]["HTTPValidationError"]["properties"]["detail"]
    kinds = [option.get("type") for option in detail["anyOf"]]
    assert kinds == ["string", "array"]
    # Both shapes really are sent.
    assert isinstance(client.post("/v1/things", json={"name": "taken"}).json()["detail"], str)
    assert isinstance(client.post("/v1/things", json={}).json()["detail"], list)


def test_input_json_cannot_write_back_is_a_422_naming_its_field_not_a_500(
    tmp_path: Path,
) -> None:
    # Python's JSON parser reads NaN, 1e999 (inf) and lone surrogates; FastAPI's own handler
    # could not write them back into the 422 body that echoes the input.
    client = _app(tmp_path)
    json_body = {"content-type": "application/json"}
    for literal, echoed in ((b"NaN", "nan"), (b"1e999", "inf"), (b"-Infinity", "-inf")):
        body = b'{"name": "a", "weight": ' + literal + b"}"
        refused = client.post("/v1/things", content=body, headers=json_body)
        assert refused.status_code == 422, refused.text
        [error] = refused.json()["detail"]
        assert (error["loc"], error["input"]) == (["body", "weight"], echoed)
    refused = client.post("/v1/short", content=b'{"name": "\\ud800"}', headers=json_body)
    assert refused.status_code == 422, refused.text
    [error] = refused.json()["detail"]
    assert (error["loc"], error["input"]) == (["body", "name"], "\\ud800")

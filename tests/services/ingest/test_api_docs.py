"""The ingest service's OpenAPI document: every operation has an id of its own (client
generators name methods after them; FastAPI only warns on a clash)."""

from __future__ import annotations

import re
import warnings

from fastapi import FastAPI

from services.ingest.api import router


def test_every_operation_has_its_own_openapi_id() -> None:
    app = FastAPI()
    app.include_router(router)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # FastAPI's "Duplicate Operation ID" is a warning
        paths = app.openapi()["paths"]
    ids = [operation["operationId"] for path in paths.values() for operation in path.values()]
    assert len(ids) == len(set(ids))
    # The relayed control-plane routes are there for every method, each with its own id.
    assert sorted(paths["/v1/fine_tuning/{rest}"]) == ["delete", "get", "patch", "post", "put"]
    # /v1/files reads its form by hand and documents it as FastAPI would.
    form = paths["/v1/files"]["post"]["requestBody"]["content"]["multipart/form-data"]["schema"]
    assert form["required"] == ["file", "purpose"]


def test_every_templated_path_parameter_is_declared_and_every_declared_one_is_in_the_path() -> None:
    # OpenAPI requires it; a validator (or schemathesis) rejects the document otherwise, and a
    # client generator cannot fill the template. FastAPI's `{rest:path}` routes once missed it.
    app = FastAPI()
    app.include_router(router)
    paths = app.openapi()["paths"]
    for path, operations in paths.items():
        templated = set(re.findall(r"\{([^}]+)\}", path))
        for method, operation in operations.items():
            parameters = operation.get("parameters", [])
            declared = {p["name"] for p in parameters if p["in"] == "path"}
            assert declared == templated, (method, path)
            assert all(p["required"] for p in parameters if p["in"] == "path"), (method, path)
    # google-genai's default API version is documented beside /v1beta, action by action.
    assert "/v1/models/{model}:generateContent" in paths
    assert "/v1/models/{model}:streamGenerateContent" in paths

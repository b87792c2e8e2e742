"""The ingest service's OpenAPI document: every operation has an id of its own (client
generators name methods after them; FastAPI only warns on a clash)."""

from __future__ import annotations

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

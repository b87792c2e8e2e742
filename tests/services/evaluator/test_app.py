"""The evaluator's app as `python -m services.evaluator` builds it: its read routes are there,
behind a tenant key, and its domain errors reach the caller as their status (app.py's mapping)."""

from __future__ import annotations

import shutil
from pathlib import Path

from fastapi.testclient import TestClient

from services.evaluator.app import create_app
from shared import auth
from shared.db import make_engine, session_scope
from tests.plugins.infra import make_settings


def test_the_app_serves_the_read_api_and_maps_its_errors(
    tmp_path: Path, sqlite_template: Path
) -> None:
    shutil.copyfile(sqlite_template, tmp_path / "tuneloop.db")
    settings = make_settings(tmp_path)
    engine = make_engine(settings.database_url)
    with session_scope(engine) as session:
        auth.ensure_tenant(session, tenant_id="acme")
        _, key = auth.issue_api_key(session, tenant_id="acme", name="tests", scope="read")
    engine.dispose()
    app = create_app(settings)
    paths = set(app.openapi()["paths"])
    assert {"/v1/evals/{job_id}", "/v1/evals/{job_id}/points/{step}/items"} <= paths
    client = TestClient(app)  # no lifespan (no bus): the routes need only the database
    headers = {"Authorization": f"Bearer {key}"}
    missing = client.get("/v1/evals/ftjob-unknown", headers=headers)
    assert missing.status_code == 404
    assert "ftjob-unknown" in missing.json()["detail"]
    assert client.get("/v1/evals/ftjob-unknown/points/x/items", headers=headers).status_code == 422
    assert client.get("/v1/evals/ftjob-unknown").status_code == 401

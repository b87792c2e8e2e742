"""Schemathesis against every service's OpenAPI document, with the whole stack up: each service
a real process (real NATS, S3, SQLite), the gateway routing every model to the local fake
upstream. Zero server errors, zero responses outside the document, and a valid document.

Bounded and deterministic (a few examples per operation, the same ones every run), so it fits
`make test` and a failure reproduces. Alone: `.venv/bin/pytest tests/integration/test_schemathesis.py`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from shared import db
from shared.dev import localstack
from shared.settings import Settings
from tests.fakes.upstream import RunningUpstream, gateway_env
from tests.plugins.infra import RunningProcess, make_settings, settings_env

ADMIN_TOKEN = "tuneloop-dev-admin"
# Per operation; with the coverage phase's own cases this keeps the run to a minute or two.
MAX_EXAMPLES = 10
CHECKS = "not_a_server_error,response_schema_conformance"
ST = str(Path(sys.executable).parent / "st")


@dataclass
class Stack:
    settings: Settings
    key: str
    processes: dict[str, RunningProcess]

    def url(self, service: str) -> str:
        return f"http://127.0.0.1:{self.settings.services.port_of(service)}"


def _tenant_key(url: str) -> str:
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    tenant = httpx.post(
        f"{url}/v1/admin/tenants", json={"id": "fuzz", "name": "fuzz"}, headers=admin
    )
    assert tenant.status_code == 201, tenant.text
    # Scope admin, the widest a tenant's key may have: every tenant route is exercised past
    # its scope check.
    key = httpx.post(
        f"{url}/v1/admin/tenants/fuzz/api_keys",
        json={"name": "schemathesis", "scope": "admin"},
        headers=admin,
    )
    assert key.status_code == 201, key.text
    return str(key.json()["key"])


@pytest.fixture(scope="module")
def stack(
    nats_server: RunningProcess,
    s3_server: RunningProcess,
    stack_settings: Settings,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("schemathesis")
    settings = make_settings(tmp, infra=stack_settings)
    db.migrate(settings.database_url)
    processes: dict[str, RunningProcess] = {}
    with RunningUpstream() as upstream:
        try:
            for name in localstack.SERVICES:
                env = (
                    gateway_env(settings, upstream, tmp)
                    if name == "ingest"
                    else settings_env(settings)
                )
                processes[name] = RunningProcess(
                    localstack.component(settings, name), tmp / "logs" / f"{name}.log", env=env
                )
                processes[name].start(timeout_s=60)
            url = f"http://127.0.0.1:{settings.services.ingest_port}"
            yield Stack(settings, _tenant_key(url), processes)
        finally:
            for process in processes.values():
                process.stop()


def schemathesis(
    url: str, token: str, report: Path, *, only_tag: str | None = None, skip_tag: str | None = None
) -> subprocess.CompletedProcess[str]:
    """`st run` against the service at `url`, its JSON report written to `report`."""
    argv = [
        ST, "run", f"{url}/openapi.json",
        "--header", f"Authorization: Bearer {token}",
        "--checks", CHECKS,
        "--phases", "examples,coverage,fuzzing",
        "--max-examples", str(MAX_EXAMPLES),
        "--generation-deterministic",
        "--workers", "1",
        "--request-timeout", "30",
        "--no-color",
        "--report", "json",
        "--report-json-path", str(report),
    ]  # fmt: skip
    if only_tag is not None:
        argv += ["--include-tag", only_tag]
    if skip_tag is not None:
        argv += ["--exclude-tag", skip_tag]
    # In the report's folder: st keeps a cache of its crashes in the working directory.
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=600, check=False, cwd=report.parent
    )


def _assert_clean(result: subprocess.CompletedProcess[str], report: Path) -> None:
    # The exit status says whether a check failed or an operation (or the document) errored;
    # the report names them, the output shows each case with a curl line to reproduce it.
    summary = json.loads(report.read_text()) if report.exists() else {}
    problems = {"failures": summary.get("failures"), "errors": summary.get("errors")}
    assert result.returncode == 0, (
        f"schemathesis found problems: {json.dumps(problems)}\n"
        f"{result.stdout[-15000:]}\n{result.stderr[-2000:]}"
    )


def _tags(url: str) -> set[str]:
    document = httpx.get(f"{url}/openapi.json").json()
    return {
        tag
        for path in document["paths"].values()
        for op in path.values()
        for tag in op.get("tags", [])
    }


@pytest.mark.slow
@pytest.mark.parametrize("service", localstack.SERVICES)
@pytest.mark.parametrize("caller", ["tenant", "admin"])
def test_every_operation_answers_within_its_document(
    stack: Stack, service: str, caller: str, tmp_path: Path
) -> None:
    # Admin routes take the admin token, every other route a tenant key: one run each, so every
    # operation is exercised past its authentication.
    url = stack.url(service)
    if caller == "admin" and "admin" not in _tags(url):
        pytest.skip(f"{service} has no admin routes")
    token, only, skip = (
        (stack.key, None, "admin") if caller == "tenant" else (ADMIN_TOKEN, "admin", None)
    )
    report = tmp_path / "report.json"
    _assert_clean(schemathesis(url, token, report, only_tag=only, skip_tag=skip), report)

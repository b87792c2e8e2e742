"""The ingest service as a real process (real NATS, S3, SQLite) in front of a fake upstream that
answers with the providers' recorded bytes; shared by the ingest test modules."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from shared import db
from shared.dev import localstack
from shared.settings import Settings
from tests.fakes.upstream import FakeUpstream, RunningUpstream, gateway_env
from tests.plugins.infra import RunningProcess, make_settings
from tests.plugins.tenants import tenant_key

# /v1/files takes at most this much in the tests' service (so that going over it is cheap).
UPLOAD_LIMIT = 4 * 1024**2


@dataclass
class Edge:
    url: str
    key: str
    other_key: str
    upstream: FakeUpstream
    process: RunningProcess
    settings: Settings
    env: dict[str, str]

    def samples(self, key: str | None = None, **params: Any) -> list[dict[str, Any]]:
        response = httpx.get(
            f"{self.url}/v1/samples",
            params=params,
            headers={"Authorization": f"Bearer {key or self.key}"},
        )
        response.raise_for_status()
        return response.json()["data"]

    def wait_for_samples(self, count: int, **params: Any) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []

        def enough() -> bool:
            nonlocal found
            found = self.samples(**params)
            return len(found) >= count

        assert localstack.wait_until(enough, 40, interval_s=0.2), (
            f"only {len(found)} samples: {found}"
        )
        return found


@pytest.fixture(scope="module")
def edge(
    nats_server: RunningProcess,
    s3_server: RunningProcess,
    stack_settings: Settings,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Edge]:
    tmp = tmp_path_factory.mktemp("edge")
    settings = make_settings(tmp, infra=stack_settings)
    db.migrate(settings.database_url)
    with RunningUpstream() as upstream:
        env = gateway_env(settings, upstream, tmp) | {
            "TUNELOOP_INGEST_MAX_UPLOAD_BYTES": str(UPLOAD_LIMIT)
        }
        process = RunningProcess(
            localstack.component(settings, "ingest"), tmp / "logs" / "ingest.log", env=env
        )
        process.start()
        url = f"http://127.0.0.1:{settings.services.ingest_port}"
        try:
            yield Edge(
                url,
                tenant_key(url, "acme"),
                tenant_key(url, "globex"),
                upstream,
                process,
                settings,
                env,
            )
        finally:
            process.stop()

"""The persister (sample.captured -> sample store) against real NATS: killed with SIGKILL in the
middle of a backlog and restarted, it stores every sample exactly once."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from shared import db
from shared.dev import localstack
from shared.settings import Settings
from tests.plugins.infra import (
    RunningProcess,
    settings_env,
    settings_on_private_nats,
)
from tests.services.ingest.capture.backlog import TOTAL, publish_backlog, stored_count


@pytest.mark.slow
def test_killed_persister_loses_nothing_and_duplicates_nothing(
    private_nats: RunningProcess,
    s3_server: RunningProcess,
    stack_settings: Settings,
    tmp_path: Path,
) -> None:
    settings = settings_on_private_nats(tmp_path / "svc", private_nats, stack_settings)
    db.migrate(settings.database_url)
    db_path = Path(settings.database_url.removeprefix("sqlite:///"))
    asyncio.run(publish_backlog(settings))

    component = localstack.component(settings, "ingest")
    log = tmp_path / "ingest.log"
    first = RunningProcess(component, log, env=settings_env(settings))
    first.start()
    try:
        assert localstack.wait_until(lambda: stored_count(db_path) > 0, 30, interval_s=0.02)
    finally:
        first.kill()
    at_kill = stored_count(db_path)
    assert at_kill < TOTAL, (
        "the backlog was gone before the kill; raise TOTAL so the kill lands mid-way"
    )

    second = RunningProcess(component, log, env=settings_env(settings))
    second.start()
    try:
        assert localstack.wait_until(lambda: stored_count(db_path) >= TOTAL, 120, interval_s=0.2), (
            stored_count(db_path)
        )
        # Give redeliveries a moment to (not) add anything.
        localstack.wait_until(lambda: False, 1.0)
        assert stored_count(db_path) == TOTAL
    finally:
        second.stop()

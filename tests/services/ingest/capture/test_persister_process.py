"""`python -m services.ingest.capture.persister`: the persister as a process of its own (real NATS and
SQLite), for deployments whose gateway processes leave persisting to it."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

from shared import db
from shared.dev import localstack
from shared.settings import Settings
from tests.plugins.infra import (
    RunningProcess,
    persister_process,
    settings_on_private_nats,
)
from tests.services.ingest.capture.backlog import TOTAL, publish_backlog, stored_count


def test_a_separate_persister_stores_every_sample_once_and_stops_on_sigterm(
    private_nats: RunningProcess,
    s3_server: RunningProcess,
    stack_settings: Settings,
    tmp_path: Path,
) -> None:
    settings = settings_on_private_nats(tmp_path / "svc", private_nats, stack_settings)
    db.migrate(settings.database_url)
    db_path = Path(settings.database_url.removeprefix("sqlite:///"))
    asyncio.run(publish_backlog(settings))  # TOTAL samples, one of them published twice
    persister = persister_process(settings, tmp_path / "persister.log")
    persister.start()
    assert localstack.wait_until(lambda: stored_count(db_path) == TOTAL, 60, interval_s=0.1), (
        f"{stored_count(db_path)} of {TOTAL} stored; log:\n{persister.log()[-2000:]}"
    )
    assert persister.process is not None
    # Background work (TUNELOOP_INGEST_BACKGROUND_CPU): a core the gateway wants comes first.
    assert os.sched_getscheduler(persister.process.pid) == os.SCHED_IDLE
    persister.process.send_signal(signal.SIGTERM)
    assert persister.process.wait(15) == 0
    assert stored_count(db_path) == TOTAL  # the duplicate made no second row

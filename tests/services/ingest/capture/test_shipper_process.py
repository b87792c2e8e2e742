"""Capture through real processes (ingest service, its shipper child, nats-server, S3, SQLite):
the gateway only journals its calls, the shipper turns them into samples; the shipper stopped,
SIGKILLed and started again loses none and stores none twice."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import httpx
import psutil
import pytest

from services.ingest.capture.journal import SegmentName, journal_dir
from shared import db
from shared.dev import localstack
from shared.settings import Settings
from tests.fakes.upstream import RunningUpstream, gateway_env, recorded
from tests.plugins.infra import RunningProcess, settings_on_private_nats
from tests.plugins.tenants import tenant_key

FIRST, SECOND = 6, 9


@pytest.mark.slow
def test_calls_journaled_by_the_gateway_are_stored_once_across_a_shipper_kill(
    private_nats: RunningProcess,
    s3_server: RunningProcess,
    stack_settings: Settings,
    tmp_path: Path,
) -> None:
    settings = settings_on_private_nats(tmp_path / "svc", private_nats, stack_settings)
    db.migrate(settings.database_url)
    with RunningUpstream() as upstream:
        env = gateway_env(settings, upstream, tmp_path)
        gateway = RunningProcess(
            localstack.component(settings, "ingest"), tmp_path / "ingest.log", env=env
        )
        gateway.start()
        try:
            url = f"http://127.0.0.1:{settings.services.ingest_port}"
            auth = {"Authorization": f"Bearer {tenant_key(url)}"}
            body = recorded("oa01_tool_calls_multiturn")["request"]["body"]

            def call() -> None:
                answer = httpx.post(f"{url}/v1/chat/completions", json=body, headers=auth)
                assert answer.status_code == 200, answer.text

            def stored() -> list[str]:
                page = httpx.get(f"{url}/v1/samples", params={"limit": 100}, headers=auth)
                return [sample["source_ref"] for sample in page.json()["data"]]

            assert localstack.wait_until(lambda: _shipper_child(gateway) is not None, 15)
            shipper = _shipper_child(gateway)
            assert shipper is not None
            # Background work: the shipper only takes a core the gateway does not want (it
            # asks for that once it has started up).
            idle = lambda: os.sched_getscheduler(shipper.pid) == os.SCHED_IDLE  # noqa: E731
            assert localstack.wait_until(idle, 15)
            shipper.suspend()  # SIGSTOP: calls are answered and journaled, not yet samples
            for _ in range(FIRST):
                call()
            assert stored() == []
            segments = [p for p in journal_dir(settings).glob("*.jsonl") if SegmentName.parse(p)]
            assert len(segments) == 1
            assert len(segments[0].read_bytes().splitlines()) == FIRST
            shipper.kill()  # the service starts another, which ships from the journal
            for _ in range(SECOND):
                call()
            assert localstack.wait_until(lambda: len(stored()) == FIRST + SECOND, 30), (
                gateway.log()[-2000:]
            )
            refs = stored()
            assert len(set(refs)) == FIRST + SECOND  # each call once

            # The gateway stops (SIGTERM): it closes its journal, and its shipper ships the
            # last segment and removes it before exiting.
            gateway.stop()
            assert sorted(p.name for p in journal_dir(settings).iterdir()) == [".shipper.lock"]
        finally:
            gateway.stop()


def _shipper_child(gateway: RunningProcess) -> psutil.Process | None:
    assert gateway.process is not None
    for child in psutil.Process(gateway.process.pid).children():
        with contextlib.suppress(psutil.NoSuchProcess):
            if "services.ingest.capture.shipper" in child.cmdline():
                return child
    return None


def _gone(process: psutil.Process) -> bool:
    try:
        return process.status() == psutil.STATUS_ZOMBIE  # exited, not reaped yet
    except psutil.NoSuchProcess:
        return True


@pytest.mark.slow
def test_the_service_runs_its_shipper_restarts_it_and_takes_it_down_with_it(
    private_nats: RunningProcess,
    s3_server: RunningProcess,
    stack_settings: Settings,
    tmp_path: Path,
) -> None:
    # As `make up` runs the service.
    settings = settings_on_private_nats(tmp_path / "svc", private_nats, stack_settings)
    db.migrate(settings.database_url)
    with RunningUpstream() as upstream:
        env = gateway_env(settings, upstream, tmp_path)
        gateway = RunningProcess(
            localstack.component(settings, "ingest"), tmp_path / "ingest.log", env=env
        )
        gateway.start()
        try:
            url = f"http://127.0.0.1:{settings.services.ingest_port}"
            auth = {"Authorization": f"Bearer {tenant_key(url)}"}
            body = recorded("oa01_tool_calls_multiturn")["request"]["body"]

            def stored() -> int:
                page = httpx.get(f"{url}/v1/samples", params={"limit": 100}, headers=auth)
                return len(page.json()["data"])

            def call_and_wait(count: int) -> None:
                answer = httpx.post(f"{url}/v1/chat/completions", json=body, headers=auth)
                assert answer.status_code == 200, answer.text
                assert localstack.wait_until(lambda: stored() == count, 30), gateway.log()[-3000:]

            call_and_wait(1)
            first = _shipper_child(gateway)
            assert first is not None
            first.kill()  # died on its own: the service starts another
            assert localstack.wait_until(
                lambda: (child := _shipper_child(gateway)) is not None and child.pid != first.pid,
                15,
            ), gateway.log()[-3000:]
            second = _shipper_child(gateway)
            assert second is not None
            call_and_wait(2)
            assert f"journal shipper (pid {first.pid}) exited" in gateway.log()
            # The service SIGKILLed alone (not its process group): the kernel stops its child.
            assert gateway.process is not None
            os.kill(gateway.process.pid, signal.SIGKILL)
            gateway.process.wait(10)
            assert localstack.wait_until(lambda: _gone(second), 20)

            # Stopped with its process group, as make down does: the child gets the SIGTERM too
            # and exits first, which is no failure to report or restart.
            logged = len(gateway.log())
            gateway.start()
            assert localstack.wait_until(lambda: _shipper_child(gateway) is not None, 15)
            call_and_wait(3)
            gateway.stop()
            assert "exited" not in gateway.log()[logged:], gateway.log()[logged:][-3000:]
        finally:
            gateway.stop()

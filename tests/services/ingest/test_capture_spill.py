"""Capture never costs the caller: with NATS gone, calls still succeed. Either the gateway is
SIGKILLed right after answering them, and once NATS and the gateway are back every sample is
stored (from the write-ahead journal or the spill file); or it keeps running, and once NATS is
back it delivers what it spilled by itself. In both capture modes."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from shared import db, localstack
from shared.settings import Settings
from tests.fakes.upstream import FakeUpstream, RunningUpstream, gateway_env, recorded
from tests.plugins.infra import (
    RunningProcess,
    settings_on_private_nats,
)
from tests.services.ingest.conftest import ADMIN

CALLS_WHILE_AWAY = 5


def _start_gateway(
    settings: Settings, upstream: FakeUpstream, directory: Path, capture: str
) -> tuple[RunningProcess, dict[str, str]]:
    """An ingest process in `capture` mode, routing to the fake; and its environment."""
    env = gateway_env(settings, upstream, directory) | {"TUNELOOP_INGEST_CAPTURE": capture}
    gateway = RunningProcess(
        localstack.component(settings, "ingest"), directory / "ingest.log", env=env
    )
    gateway.start()
    return gateway, env


def _tenant_auth(url: str) -> dict[str, str]:
    """Headers of a new key of a new tenant, acme."""
    tenant = {"id": "acme", "name": "Acme"}
    assert httpx.post(f"{url}/v1/admin/tenants", json=tenant, headers=ADMIN).status_code == 201
    key = httpx.post(
        f"{url}/v1/admin/tenants/acme/api_keys", json={"name": "t"}, headers=ADMIN
    ).json()["key"]
    return {"Authorization": f"Bearer {key}"}


def _spilled(settings: Settings) -> int:
    spill_dir = settings.app.data_dir / "ingest"
    return sum(len(p.read_bytes().splitlines()) for p in spill_dir.glob("capture-spill.jsonl*"))


@pytest.mark.slow
# process (the default): the gateway journals, its child shipper makes the samples; it gets
# SIGTERM from the kernel when the gateway is SIGKILLed, and the new gateway starts a new one.
# inline -> process: a data dir left by a killed inline gateway, taken over by the default mode
# (an upgrade): what the dead process had journaled or spilled is still stored, once.
@pytest.mark.parametrize(
    ("capture", "after"), [("process", "process"), ("inline", "inline"), ("inline", "process")]
)
def test_calls_succeed_while_nats_is_away_and_no_sample_is_lost(
    capture: str,
    after: str,
    private_nats: RunningProcess,
    s3_server: RunningProcess,
    stack_settings: Settings,
    tmp_path: Path,
) -> None:
    settings = settings_on_private_nats(tmp_path / "svc", private_nats, stack_settings)
    db.migrate(settings.database_url)
    with RunningUpstream() as upstream:
        component = localstack.component(settings, "ingest")
        gateway, env = _start_gateway(settings, upstream, tmp_path, capture)
        url = f"http://127.0.0.1:{settings.services.ingest_port}"
        auth = _tenant_auth(url)
        body = recorded("oa01_tool_calls_multiturn")["request"]["body"]

        def stored() -> int:
            return len(
                httpx.get(f"{url}/v1/samples", params={"limit": 100}, headers=auth).json()["data"]
            )

        try:
            assert (
                httpx.post(f"{url}/v1/chat/completions", json=body, headers=auth).status_code == 200
            )
            assert localstack.wait_until(lambda: stored() == 1, 20)

            private_nats.kill()
            for _ in range(CALLS_WHILE_AWAY):
                answer = httpx.post(
                    f"{url}/v1/chat/completions", json=body, headers=auth, timeout=10
                )
                assert answer.status_code == 200
                assert (
                    answer.json()["id"]
                    == recorded("oa01_tool_calls_multiturn")["response"]["body"]["id"]
                )
            # Killed at once: the calls are in the journal, in the spill file, or on their way
            # from one to the other; none may be lost.
            gateway.kill()
            private_nats.start()
            env["TUNELOOP_INGEST_CAPTURE"] = after
            gateway = RunningProcess(component, tmp_path / "ingest.log", env=env)
            gateway.start()
            assert localstack.wait_until(lambda: stored() == 1 + CALLS_WHILE_AWAY, 90), (
                gateway.log()[-3000:]
            )
            assert localstack.wait_until(lambda: _spilled(settings) == 0, 30)
        finally:
            gateway.stop()


@pytest.mark.slow
@pytest.mark.parametrize("capture", ["process", "inline"])
def test_a_running_gateway_delivers_what_it_spilled_once_nats_returns(
    capture: str,
    private_nats: RunningProcess,
    s3_server: RunningProcess,
    stack_settings: Settings,
    tmp_path: Path,
) -> None:
    settings = settings_on_private_nats(tmp_path / "svc", private_nats, stack_settings)
    db.migrate(settings.database_url)
    with RunningUpstream() as upstream:
        gateway, _ = _start_gateway(settings, upstream, tmp_path, capture)
        url = f"http://127.0.0.1:{settings.services.ingest_port}"
        auth = _tenant_auth(url)
        body = recorded("oa01_tool_calls_multiturn")["request"]["body"]

        def stored() -> int:
            found = httpx.get(f"{url}/v1/samples", params={"limit": 100}, headers=auth)
            return len(found.json()["data"])

        try:
            private_nats.kill()
            for _ in range(CALLS_WHILE_AWAY):
                answer = httpx.post(
                    f"{url}/v1/chat/completions", json=body, headers=auth, timeout=10
                )
                assert answer.status_code == 200
            if capture == "inline":
                # The publisher gives up on NATS and spills every sample to the local file.
                assert localstack.wait_until(lambda: _spilled(settings) == CALLS_WHILE_AWAY, 40), (
                    _spilled(settings)
                )
            else:
                # The journal holds the calls; the shipper waits for NATS instead of spilling.
                localstack.wait_until(lambda: False, 3.0)
            private_nats.start()
            # The same gateway process, never restarted, replays what it holds.
            assert localstack.wait_until(lambda: stored() == CALLS_WHILE_AWAY, 90), gateway.log()[
                -3000:
            ]
            assert localstack.wait_until(lambda: _spilled(settings) == 0, 30)
            assert gateway.process is not None
            assert gateway.process.poll() is None  # still the first process
        finally:
            gateway.stop()

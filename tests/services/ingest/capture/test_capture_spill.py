"""Capture never costs the caller, and keeps everything it accepted. With NATS gone, calls still
succeed: either the gateway is SIGKILLed right after answering them, and once NATS and the
gateway are back every sample is stored (from the write-ahead journal or the spill file); or it
keeps running, and once NATS is back it delivers what it spilled by itself. An outage long
enough to fill the spill file refuses capture past its cap, loudly and counted, never the call.
A call larger than the samples stream takes is stored whole (by reference through S3)."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import nats
import nats.js.errors
import pytest

from shared import db
from shared.dev import localstack
from shared.events import CAPTURE, CaptureSpilled
from shared.settings import Settings
from tests.fakes.upstream import FakeUpstream, RunningUpstream, gateway_env, recorded
from tests.plugins.infra import (
    RunningProcess,
    settings_on_private_nats,
)
from tests.plugins.tenants import tenant_key

CALLS_WHILE_AWAY = 5


def _start_gateway(
    settings: Settings, upstream: FakeUpstream, directory: Path, **extra: str
) -> tuple[RunningProcess, dict[str, str]]:
    """An ingest process routing to the fake; and its environment (`extra` added)."""
    env = gateway_env(settings, upstream, directory) | extra
    gateway = RunningProcess(
        localstack.component(settings, "ingest"), directory / "ingest.log", env=env
    )
    gateway.start()
    return gateway, env


def _spilled(settings: Settings) -> int:
    spill_dir = settings.app.data_dir / "ingest"
    return sum(len(p.read_bytes().splitlines()) for p in spill_dir.glob("capture-spill.jsonl*"))


@pytest.mark.slow
# The gateway journals, its child shipper makes the samples; the shipper gets SIGTERM from the
# kernel when the gateway is SIGKILLed, and the new gateway starts a new one.
def test_calls_succeed_while_nats_is_away_and_no_sample_is_lost(
    private_nats: RunningProcess,
    s3_server: RunningProcess,
    stack_settings: Settings,
    tmp_path: Path,
) -> None:
    settings = settings_on_private_nats(tmp_path / "svc", private_nats, stack_settings)
    db.migrate(settings.database_url)
    with RunningUpstream() as upstream:
        component = localstack.component(settings, "ingest")
        gateway, env = _start_gateway(settings, upstream, tmp_path)
        url = f"http://127.0.0.1:{settings.services.ingest_port}"
        auth = {"Authorization": f"Bearer {tenant_key(url)}"}
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
            gateway = RunningProcess(component, tmp_path / "ingest.log", env=env)
            gateway.start()
            assert localstack.wait_until(lambda: stored() == 1 + CALLS_WHILE_AWAY, 90), (
                gateway.log()[-3000:]
            )
            assert localstack.wait_until(lambda: _spilled(settings) == 0, 30)
        finally:
            gateway.stop()


@pytest.mark.slow
def test_a_running_gateway_delivers_what_it_spilled_once_nats_returns(
    private_nats: RunningProcess,
    s3_server: RunningProcess,
    stack_settings: Settings,
    tmp_path: Path,
) -> None:
    settings = settings_on_private_nats(tmp_path / "svc", private_nats, stack_settings)
    db.migrate(settings.database_url)
    with RunningUpstream() as upstream:
        gateway, _ = _start_gateway(settings, upstream, tmp_path)
        url = f"http://127.0.0.1:{settings.services.ingest_port}"
        auth = {"Authorization": f"Bearer {tenant_key(url)}"}
        body = recorded("oa01_tool_calls_multiturn")["request"]["body"]

        def stored() -> int:
            found = httpx.get(f"{url}/v1/samples", params={"limit": 100}, headers=auth)
            return len(found.json()["data"])

        try:
            assert _spill_metrics(url) == {"bytes": 0, "records": 0, "episodes_total": 0}
            private_nats.kill()
            for _ in range(CALLS_WHILE_AWAY):
                answer = httpx.post(
                    f"{url}/v1/chat/completions", json=body, headers=auth, timeout=10
                )
                assert answer.status_code == 200
            # The shipper's publishes fail, and it keeps the samples in the spill file.
            assert localstack.wait_until(lambda: _spilled(settings) == CALLS_WHILE_AWAY, 40), (
                _spilled(settings)
            )
            # The service's /metrics says so (what TuneloopCaptureSpilling reads).
            assert localstack.wait_until(
                lambda: _spill_metrics(url)["records"] == CALLS_WHILE_AWAY, 10
            ), _spill_metrics(url)
            spilling = _spill_metrics(url)
            assert spilling["episodes_total"] == 1
            assert spilling["bytes"] == _spill_bytes(settings) > 0
            private_nats.start()
            # The same gateway process, never restarted, replays what it holds.
            assert localstack.wait_until(lambda: stored() == CALLS_WHILE_AWAY, 90), gateway.log()[
                -3000:
            ]
            assert localstack.wait_until(lambda: _spilled(settings) == 0, 30)
            assert gateway.process is not None
            assert gateway.process.poll() is None  # still the first process
            # Then acme is told, on the bus that was away: one capture.spilled for the episode.
            told = _capture_spilled(settings, "acme")
            assert (told.samples, told.refused) == (CALLS_WHILE_AWAY, 0)
            assert told.bytes >= spilling["bytes"] - 100 * CALLS_WHILE_AWAY  # lines' envelope
            assert told.started_at < told.ended_at
            assert 0 < told.max_backlog_fraction < 0.01  # of the 1 GiB default cap
            assert _spill_metrics(url) == {"bytes": 0, "records": 0, "episodes_total": 1}
        finally:
            gateway.stop()


def _spill_metrics(url: str) -> dict[str, int]:
    """The spill file's gauges and episodes on the service's /metrics."""
    text = httpx.get(f"{url}/metrics").text
    found = re.findall(r"^tuneloop_capture_spill_(bytes|records|episodes_total)\S* (\S+)$",
                       text, flags=re.MULTILINE)  # fmt: skip
    return {name: int(float(value)) for name, value in found}


def _spill_bytes(settings: Settings) -> int:
    spill_dir = settings.app.data_dir / "ingest"
    return sum(p.stat().st_size for p in spill_dir.glob("capture-spill.jsonl*"))


def _capture_spilled(settings: Settings, tenant: str, timeout_s: float = 20.0) -> CaptureSpilled:
    """The tenant's capture.spilled, read from its stream as an integrator would."""

    async def read() -> CaptureSpilled:
        connection = await nats.connect(settings.nats.url)
        try:
            js = connection.jetstream()
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    message = await js.get_last_msg(
                        CAPTURE.name, CaptureSpilled.subject_for(tenant)
                    )
                    return CaptureSpilled.model_validate_json(message.data)
                except nats.js.errors.NotFoundError:
                    assert time.monotonic() < deadline, "no capture.spilled"
                    await asyncio.sleep(0.2)
        finally:
            await connection.close()

    return asyncio.run(read())


def _fidelity(url: str, auth: dict[str, str]) -> dict[str, Any]:
    answer = httpx.get(f"{url}/v1/ingest/fidelity", headers=auth)
    assert answer.status_code == 200, answer.text
    report: dict[str, Any] = answer.json()
    return report


@pytest.mark.slow
def test_an_outage_past_the_spill_cap_refuses_capture_loudly_never_the_call(
    private_nats: RunningProcess,
    s3_server: RunningProcess,
    stack_settings: Settings,
    tmp_path: Path,
) -> None:
    settings = settings_on_private_nats(tmp_path / "svc", private_nats, stack_settings)
    db.migrate(settings.database_url)
    calls = 12
    with RunningUpstream() as upstream:
        # Room for a few samples of this call (~5 KB each), not for twelve.
        cap = 16 * 1024
        gateway, _ = _start_gateway(
            settings, upstream, tmp_path, TUNELOOP_INGEST_SPILL_MAX_BYTES=str(cap)
        )
        url = f"http://127.0.0.1:{settings.services.ingest_port}"
        auth = {"Authorization": f"Bearer {tenant_key(url)}"}
        body = recorded("oa01_tool_calls_multiturn")["request"]["body"]

        def stored() -> int:
            found = httpx.get(f"{url}/v1/samples", params={"limit": 100}, headers=auth)
            return len(found.json()["data"])

        def refused() -> int:
            gateway_report = _fidelity(url, auth).get("gateway", {})
            return int(gateway_report.get("dropped", {}).get("capture spill full", 0))

        try:
            private_nats.kill()
            for _ in range(calls):
                answer = httpx.post(
                    f"{url}/v1/chat/completions", json=body, headers=auth, timeout=10
                )
                assert answer.status_code == 200  # the user's call succeeds, capture or not
            assert localstack.wait_until(lambda: "capture refused" in gateway.log(), 60), (
                gateway.log()[-3000:]
            )
            spill_dir = settings.app.data_dir / "ingest"
            held = sum(p.stat().st_size for p in spill_dir.glob("capture-spill.jsonl*"))
            assert 0 < held <= cap
            assert localstack.wait_until(lambda: refused() > 0, 30)  # counted, per tenant
            private_nats.start()
            # Everything the spill file kept is stored. (A refused sample may be stored too:
            # the NATS client buffers what it was given while the server was away and sends
            # it on reconnecting; a refusal counts what capture could not keep itself.)
            assert localstack.wait_until(lambda: _spilled(settings) == 0, 60), gateway.log()[-3000:]
            assert localstack.wait_until(lambda: stored() >= calls - refused(), 60), (
                stored(),
                refused(),
                gateway.log()[-3000:],
            )
            assert stored() <= calls
        finally:
            gateway.stop()


@pytest.mark.slow
def test_a_call_larger_than_the_samples_stream_takes_is_stored_whole(
    private_nats: RunningProcess,
    s3_server: RunningProcess,
    stack_settings: Settings,
    tmp_path: Path,
) -> None:
    settings = settings_on_private_nats(tmp_path / "svc", private_nats, stack_settings)
    db.migrate(settings.database_url)
    with RunningUpstream() as upstream:
        gateway, _ = _start_gateway(settings, upstream, tmp_path)
        url = f"http://127.0.0.1:{settings.services.ingest_port}"
        auth = {"Authorization": f"Bearer {tenant_key(url)}"}
        body = recorded("oa01_tool_calls_multiturn")["request"]["body"]
        # 10 MiB of prompt: under the gateway's 32 MiB body limit, over the stream's 8 MiB.
        document = "".join(f"line {n:07d} of a very long document\n" for n in range(300_000))
        assert len(document) > 10 * 1024**2
        big = body | {"messages": [{"role": "user", "content": document}, *body["messages"]]}
        try:
            answer = httpx.post(f"{url}/v1/chat/completions", json=big, headers=auth, timeout=30)
            assert answer.status_code == 200

            def found() -> list[dict[str, Any]]:
                page = httpx.get(f"{url}/v1/samples", params={"limit": 10}, headers=auth)
                data: list[dict[str, Any]] = page.json()["data"]
                return data

            assert localstack.wait_until(lambda: len(found()) == 1, 60), gateway.log()[-3000:]
            [summary] = found()
            sample = httpx.get(f"{url}/v1/samples/{summary['id']}", headers=auth, timeout=30)
            assert sample.status_code == 200, sample.text[:500]
            first = sample.json()["messages"][0]
            assert first["content"][0]["text"] == document
            assert "published by reference" in gateway.log()
            assert _spilled(settings) == 0  # stored at once, nothing left to retry
        finally:
            gateway.stop()


class SteadyLoad:
    """Calls through the gateway from a few threads until stopped, each with a prompt of its own;
    keeps the numbers of the calls that were answered (accepted)."""

    def __init__(self, url: str, auth: dict[str, str], threads: int = 6) -> None:
        self.url, self.auth = url, auth
        self.body = recorded("oa01_tool_calls_multiturn")["request"]["body"]
        self.answered: set[int] = set()
        self.failed = 0
        self._next = itertools.count()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def _run(self) -> None:
        with httpx.Client(timeout=10) as client:
            while not self._stop.is_set():
                n = next(self._next)
                prompt = {"role": "user", "content": f"load-call-{n}-end"}
                body = self.body | {"messages": [*self.body["messages"], prompt]}
                try:
                    answer = client.post(
                        f"{self.url}/v1/chat/completions", json=body, headers=self.auth
                    )
                except httpx.HTTPError:  # the gateway is down: not accepted
                    self.failed += 1
                    time.sleep(0.05)
                    continue
                if answer.status_code == 200:
                    self.answered.add(n)
                else:
                    self.failed += 1

    def __enter__(self) -> SteadyLoad:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(15)


def _stored_calls(url: str, auth: dict[str, str]) -> list[int]:
    """The load's call numbers of every stored sample (with repeats, if any was stored twice)."""
    found: list[int] = []
    cursor = None
    while True:
        params: dict[str, str | int] = {"limit": 500} | ({"cursor": cursor} if cursor else {})
        page = httpx.get(f"{url}/v1/samples", params=params, headers=auth, timeout=30).json()
        for sample in page["data"]:
            found += [int(n) for n in re.findall(r"load-call-(\d+)-end", json.dumps(sample))]
        cursor = page.get("next_cursor")
        if not cursor:
            return found


@pytest.mark.slow
def test_kill_9_of_nats_and_of_the_gateway_under_steady_load_loses_no_answered_call(
    private_nats: RunningProcess,
    s3_server: RunningProcess,
    stack_settings: Settings,
    tmp_path: Path,
) -> None:
    settings = settings_on_private_nats(tmp_path / "svc", private_nats, stack_settings)
    db.migrate(settings.database_url)
    with RunningUpstream() as upstream:
        gateway, env = _start_gateway(settings, upstream, tmp_path)
        url = f"http://127.0.0.1:{settings.services.ingest_port}"
        auth = {"Authorization": f"Bearer {tenant_key(url)}"}
        try:
            with SteadyLoad(url, auth) as load:
                time.sleep(3)
                private_nats.kill()  # SIGKILL
                time.sleep(3)
                private_nats.start()
                time.sleep(2)
                gateway.kill()  # SIGKILL, calls in flight
                gateway = RunningProcess(
                    localstack.component(settings, "ingest"), tmp_path / "ingest.log", env=env
                )
                gateway.start()
                time.sleep(3)
            assert len(load.answered) > 50, (len(load.answered), load.failed)

            def all_stored() -> bool:
                return load.answered <= set(_stored_calls(url, auth))

            assert localstack.wait_until(all_stored, 120), (
                sorted(load.answered - set(_stored_calls(url, auth)))[:20],
                gateway.log()[-3000:],
            )
            stored = _stored_calls(url, auth)
            assert len(stored) == len(set(stored))  # none stored twice
        finally:
            gateway.stop()

"""Service processes talking through a real nats-server: presence heartbeats published by one
process are consumed by another, and a service survives NATS going away and coming back."""

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from shared import db
from shared.dev import localstack
from shared.settings import Settings
from tests.plugins.infra import RunningProcess, make_settings, settings_env


def start_service(settings: Settings, name: str) -> RunningProcess:
    data_dir = settings.app.data_dir
    proc = RunningProcess(
        localstack.component(settings, name),
        data_dir / "logs" / f"{name}.log",
        env=settings_env(settings),
    )
    proc.start(timeout_s=60)
    return proc


def health(settings: Settings, name: str, path: str = "/healthz") -> httpx.Response:
    return httpx.get(f"http://127.0.0.1:{settings.services.port_of(name)}{path}", timeout=2.0)


def peer_services(settings: Settings, name: str) -> set[str]:
    return {peer["service"] for peer in health(settings, name).json()["peers"]}


@pytest.fixture
def services_settings(
    nats_server: RunningProcess, s3_server: RunningProcess, stack_settings: Settings, tmp_path: Path
) -> Settings:
    """The session's NATS and S3; a data dir, database and service ports of the test's own."""
    settings = make_settings(
        tmp_path, infra=stack_settings, telemetry={"heartbeat_interval_s": 0.5}
    )
    db.migrate(settings.database_url)
    return settings


@pytest.fixture
def two_services(services_settings: Settings) -> Iterator[tuple[RunningProcess, RunningProcess]]:
    ingest = start_service(services_settings, "ingest")
    try:
        scheduler = start_service(services_settings, "scheduler")
    except RuntimeError:
        ingest.stop()
        raise
    yield ingest, scheduler
    ingest.stop()
    scheduler.stop()


def test_an_event_from_one_service_process_is_consumed_by_another(
    services_settings: Settings, two_services: tuple[RunningProcess, RunningProcess]
) -> None:
    assert localstack.wait_until(
        lambda: "scheduler" in peer_services(services_settings, "ingest"), 15
    )
    assert localstack.wait_until(
        lambda: "ingest" in peer_services(services_settings, "scheduler"), 15
    )
    body = health(services_settings, "ingest").json()
    assert body["bus"] == "connected"
    assert body["status"] == "ok"
    scheduler_peer = next(peer for peer in body["peers"] if peer["service"] == "scheduler")
    assert (
        scheduler_peer["address"] == f"http://127.0.0.1:{services_settings.services.scheduler_port}"
    )


def test_each_service_serves_metrics(services_settings: Settings, two_services: object) -> None:
    health(services_settings, "ingest")
    response = health(services_settings, "ingest", "/metrics")
    assert response.status_code == 200
    assert "http_server_requests_total" in response.text
    assert 'route="/healthz"' in response.text


@pytest.mark.slow
def test_service_reconnects_when_nats_returns(
    private_nats: RunningProcess,
    s3_server: RunningProcess,
    stack_settings: Settings,
    tmp_path: Path,
) -> None:
    nats_port = private_nats.component.ports[0].number
    monitor_port = private_nats.component.ports[1].number
    settings = make_settings(
        tmp_path / "svc",
        infra=stack_settings,
        nats={"port": nats_port, "monitor_port": monitor_port},
        telemetry={"heartbeat_interval_s": 0.5},
    )
    db.migrate(settings.database_url)
    ingest = start_service(settings, "ingest")
    try:
        hoster = start_service(settings, "hoster")
    except RuntimeError:
        ingest.stop()
        raise
    try:
        assert localstack.wait_until(lambda: "hoster" in peer_services(settings, "ingest"), 15)

        private_nats.kill()
        assert localstack.wait_until(lambda: "lost; reconnecting" in ingest.log(), 15), (
            ingest.log()[-2000:]
        )
        assert localstack.wait_until(
            lambda: health(settings, "ingest", "/readyz").status_code == 503, 10
        )
        # With NATS gone, heartbeats stop arriving and the peer ages out.
        assert localstack.wait_until(lambda: "hoster" not in peer_services(settings, "ingest"), 10)

        private_nats.start()  # same port, same JetStream store
        assert localstack.wait_until(lambda: "NATS reconnected" in ingest.log(), 30), ingest.log()[
            -2000:
        ]
        assert localstack.wait_until(
            lambda: health(settings, "ingest", "/readyz").status_code == 200, 15
        )
        assert localstack.wait_until(lambda: "hoster" in peer_services(settings, "ingest"), 15)
    finally:
        ingest.stop()
        hoster.stop()

"""Real infrastructure for tests: nats-server with JetStream and SeaweedFS S3, on free ports in a temp dir.

They are started with the same command lines `make up` uses (shared.dev.localstack) and torn down at
the end. Nothing here mocks our own infrastructure.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from shared.dev import localstack
from shared.settings import S3Settings, Settings, load_settings
from shared.storage import ObjectStore

_handed_out: set[int] = set()


def free_port() -> int:
    """A port free now and not handed to another fixture of this session."""
    for _ in range(1000):
        port = random.randint(20_000, 60_000)
        if port not in _handed_out and localstack.port_is_free(port):
            _handed_out.add(port)
            return port
    raise RuntimeError("no free port found")


_S3_PORTS = (
    "port", "grpc_port", "weed_master_port", "weed_master_grpc_port", "weed_volume_port",
    "weed_volume_grpc_port", "weed_filer_port", "weed_filer_grpc_port",
)  # fmt: skip


def make_settings(
    data_dir: Path, *, infra: Settings | None = None, **overrides: dict[str, object]
) -> Settings:
    """Settings for an isolated stack under data_dir, every port free.

    With `infra`, NATS and S3 are those of `infra` (e.g. the session's servers) and only the data
    dir, database and service ports are the test's own.
    """
    base: dict[str, dict[str, object]] = {
        "app": {"env": "test", "data_dir": data_dir},
        # Small streams: each test server reserves their size on disk up front.
        "nats": {
            "port": free_port(),
            "monitor_port": free_port(),
            "stream_max_bytes": 64 * 1024**2,
        },
        "s3": {name: free_port() for name in _S3_PORTS} | {"bucket": "tuneloop-test"},
        "services": {name + "_port": free_port() for name in localstack.SERVICES},
        "db": {"url": f"sqlite:///{data_dir / 'tuneloop.db'}"},
    }
    if infra is not None:
        base["nats"] = {
            "port": infra.nats.port,
            "monitor_port": infra.nats.monitor_port,
            "stream_max_bytes": infra.nats.stream_max_bytes,
        }
        base["s3"] = {name: getattr(infra.s3, name) for name in (*_S3_PORTS, "bucket")}
    for concern, values in overrides.items():
        base.setdefault(concern, {}).update(values)
    return load_settings(**base)


def settings_env(settings: Settings) -> dict[str, str]:
    """The environment a child process needs to see the same settings."""
    s3 = settings.s3
    env = {
        "TUNELOOP_ENV": settings.app.env,
        "TUNELOOP_DATA_DIR": str(settings.app.data_dir),
        "TUNELOOP_NATS_URL": settings.nats.url,
        "TUNELOOP_NATS_PORT": str(settings.nats.port),
        "TUNELOOP_NATS_MONITOR_PORT": str(settings.nats.monitor_port),
        "TUNELOOP_NATS_STREAM_MAX_BYTES": str(settings.nats.stream_max_bytes),
        "TUNELOOP_S3_ENDPOINT": s3.endpoint,
        "TUNELOOP_S3_BUCKET": s3.bucket,
        "TUNELOOP_S3_ACCESS_KEY": s3.access_key,
        "TUNELOOP_S3_SECRET_KEY": s3.secret_key.get_secret_value(),
        "TUNELOOP_DATABASE_URL": settings.database_url,
        "TUNELOOP_TELEMETRY_HEARTBEAT_INTERVAL_S": str(settings.telemetry.heartbeat_interval_s),
    }
    for name in _S3_PORTS:
        env[f"TUNELOOP_S3_{name.upper()}"] = str(getattr(s3, name))
    for name in localstack.SERVICES:
        env[f"TUNELOOP_{name.upper()}_PORT"] = str(settings.services.port_of(name))
    return env


@dataclass
class RunningProcess:
    """A stack component started by a fixture; can be stopped and started again (same ports, same data)."""

    component: localstack.Component
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 60.0) -> None:
        # A restart on the same ports (after kill or stop) can find a port still held for a
        # moment by the dead process's closing connections (seen once in CI: the restarted
        # ingest failed to bind). Wait for the ports first; one still busy fails below as before.
        localstack.wait_until(self._ports_free, 10.0, interval_s=0.1)
        self.process = localstack.spawn(self.component, self.log_path, env=self.env)
        _started.append(self)
        process = self.process

        def ready_or_dead() -> bool:
            return process.poll() is not None or self.component.ready()

        if not localstack.wait_until(ready_or_dead, timeout_s) or process.poll() is not None:
            self.stop()
            tail = self.log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(
                f"{self.component.name} did not become ready in {timeout_s}s; log:\n{tail}"
            )

    def _ports_free(self) -> bool:
        return all(localstack.port_is_free(port.number) for port in self.component.ports)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        timeout_s = self.component.stop_timeout_s
        os.killpg(self.process.pid, sig)
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout_s)

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


_started: list[RunningProcess] = []


@pytest.fixture(scope="session", autouse=True)
def _no_process_outlives_the_session() -> Iterator[None]:
    """A test that fails between starting two processes must not leave the first running."""
    yield
    for proc in reversed(_started):
        proc.stop()


@pytest.fixture(scope="session")
def stack_settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """Settings shared by the session's NATS and S3 servers (and any service a test starts)."""
    return make_settings(tmp_path_factory.mktemp("stack"))


@pytest.fixture(scope="session")
def nats_server(stack_settings: Settings) -> Iterator[RunningProcess]:
    data_dir = stack_settings.app.data_dir
    proc = RunningProcess(
        localstack.component(stack_settings, "nats"), data_dir / "logs" / "nats.log"
    )
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture(scope="session")
def s3_server(stack_settings: Settings) -> Iterator[RunningProcess]:
    data_dir = stack_settings.app.data_dir
    proc = RunningProcess(localstack.component(stack_settings, "s3"), data_dir / "logs" / "s3.log")
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture
def private_nats(tmp_path: Path) -> Iterator[RunningProcess]:
    """A nats-server of the test's own, for tests that kill and restart it."""
    settings = make_settings(tmp_path)
    proc = RunningProcess(localstack.component(settings, "nats"), tmp_path / "logs" / "nats.log")
    proc.start()
    yield proc
    proc.stop()


@contextlib.contextmanager
def bucket_of_its_own(s3: S3Settings) -> Iterator[ObjectStore]:
    """A store on a new bucket, removed afterwards: the session's SeaweedFS gives each bucket 7
    volume slots of the few hundred its disk allows, so kept buckets run it out (500s)."""
    store = ObjectStore.from_settings(s3, bucket=f"t-{uuid.uuid4().hex[:16]}")
    store.ensure_bucket()
    try:
        yield store
    finally:
        store.remove_bucket()


@pytest.fixture
def object_store(s3_server: RunningProcess, stack_settings: Settings) -> Iterator[ObjectStore]:
    """A store on a bucket of the test's own on the session's S3 server, so tests never collide."""
    with bucket_of_its_own(stack_settings.s3) as store:
        yield store


def module_process(
    module: str,
    ready_line: str,
    settings: Settings,
    log_path: Path,
    env: dict[str, str] | None = None,
) -> RunningProcess:
    """`python -m <module>` against these settings, ready once its log says `ready_line`."""
    component = localstack.Component(
        name=module.rsplit(".", 1)[-1],
        argv=[sys.executable, "-m", module],
        ports=[],
        address="",
        ready=lambda: log_path.exists() and ready_line in log_path.read_text("utf-8", "replace"),
    )
    return RunningProcess(component, log_path, env=settings_env(settings) | (env or {}))


def persister_process(settings: Settings, log_path: Path) -> RunningProcess:
    """`python -m services.ingest.capture.persister`, ready once it consumes."""
    return module_process(
        "services.ingest.capture.persister", "persisting samples", settings, log_path
    )


def settings_on_private_nats(
    path: Path, private_nats: RunningProcess, stack_settings: Settings
) -> Settings:
    """Settings under `path` on the session's S3 but the test's own nats-server (private_nats)."""
    return make_settings(
        path,
        infra=stack_settings,
        nats={
            "port": private_nats.component.ports[0].number,
            "monitor_port": private_nats.component.ports[1].number,
        },
    )


def dead_pid() -> int:
    """The pid of a process that has exited (and was reaped): nothing runs under it now."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid

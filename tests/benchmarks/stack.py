"""What both benchmarks start: real nats-server, SeaweedFS S3 and the ingest service as processes
on free ports in a temp dir (the same command lines the tests and `make up` use), a tenant key,
and a cleanup that stops every process on any exit, Ctrl-C and SIGTERM included.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import httpx
from rich.console import Console

from shared import db
from shared.dev import localstack
from shared.settings import Settings
from tests.plugins.infra import RunningProcess, make_settings, settings_env

ADMIN = {"Authorization": "Bearer tuneloop-dev-admin"}


@dataclass
class Ingest:
    """A running ingest service and what a benchmark needs to talk to it."""

    url: str
    key: str
    process: RunningProcess
    settings: Settings
    db_path: Path

    @property
    def pid(self) -> int:
        assert self.process.process is not None
        return self.process.process.pid

    def count_samples(self, source: str) -> int:
        """Persisted samples of one source, read straight from the SQLite file (read-only), so
        counting puts no load on the service being measured."""
        with contextlib.closing(
            sqlite3.connect(f"file:{self.db_path}?mode=ro", uri=True, timeout=5)
        ) as connection:
            row = connection.execute(
                "SELECT count(*) FROM ingest_samples WHERE source = ?", (source,)
            ).fetchone()
        return int(row[0])


def make_console() -> Console:
    """Rich output; wide tables stay whole when piped to a file or a CI log."""
    return Console() if sys.stdout.isatty() else Console(width=170)


def sigterm_as_interrupt() -> None:
    """SIGTERM (make interrupted, a CI timeout) unwinds like Ctrl-C, so every finally runs."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)


@contextlib.contextmanager
def workdir(keep: bool) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="tuneloop-bench-"))
    try:
        yield path
    finally:
        if keep:
            print(f"kept {path} (logs, database)")
        else:
            shutil.rmtree(path, ignore_errors=True)


def launch_process(
    stack: contextlib.ExitStack, process: RunningProcess, timeout_s: float = 90
) -> None:
    """Start a process and register its stop, so it is stopped however the benchmark ends."""
    stack.callback(process.stop)
    process.start(timeout_s=timeout_s)


def start_infra(stack: contextlib.ExitStack, tmp: Path) -> Settings:
    """nats-server and weed on free ports under tmp; returns settings that point at them."""
    settings = make_settings(tmp)
    for name in ("nats", "s3"):
        component = localstack.component(settings, name)
        launch_process(stack, RunningProcess(component, tmp / "logs" / f"{name}.log"))
    return settings


def start_ingest(
    stack: contextlib.ExitStack, settings: Settings, tmp: Path, env: dict[str, str] | None = None
) -> Ingest:
    """The ingest service as a real process with its own SQLite database, and a tenant key."""
    db.migrate(settings.database_url)
    process = RunningProcess(
        localstack.component(settings, "ingest"),
        tmp / "logs" / "ingest.log",
        env=settings_env(settings) | (env or {}),
    )
    launch_process(stack, process)
    url = f"http://127.0.0.1:{settings.services.ingest_port}"
    db_path = Path(settings.database_url.removeprefix("sqlite:///"))
    return Ingest(url, tenant_key(url, "bench"), process, settings, db_path)


def tenant_key(url: str, tenant: str) -> str:
    created = httpx.post(
        f"{url}/v1/admin/tenants", json={"id": tenant, "name": tenant}, headers=ADMIN
    )
    created.raise_for_status()
    response = httpx.post(
        f"{url}/v1/admin/tenants/{tenant}/api_keys", json={"name": "bench"}, headers=ADMIN
    )
    response.raise_for_status()
    return str(response.json()["key"])


def wait_for_count(
    count: Callable[[], int],
    expected: int,
    *,
    timeout_s: float,
    stall_s: float = 15.0,
    interval_s: float = 0.05,
) -> tuple[int, float]:
    """Poll until `count()` reaches `expected` or stops moving for stall_s (longer than the
    persister's 5 s batch fetch timeout), bounded by timeout_s. Returns the last count and the
    monotonic time it was first seen."""
    deadline = time.monotonic() + timeout_s
    last, last_at, changed_at = -1, time.monotonic(), time.monotonic()
    while True:
        now = time.monotonic()
        value = count()
        if value != last:
            last, last_at, changed_at = value, now, now
        if value >= expected or now > deadline or now - changed_at > stall_s:
            return last, last_at
        time.sleep(interval_s)

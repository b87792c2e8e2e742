"""A short process supervisor for the local stack: start in the background, stop exactly, report.

Each component of deploy/local/stack.yaml runs in its own session with its output in
`<data_dir>/logs/<name>.log` and a pidfile in `<data_dir>/run/` that records the process's
creation time, so `down` never signals a recycled pid. `up` refuses to half-start: every port
is checked first, and a component that does not become ready stops what this call started.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from shared import localstack
from shared.localstack import Component
from shared.settings import Settings

READY_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 15.0


class StackError(RuntimeError):
    """The stack could not be brought to the requested state; the message says why and what to do."""


@dataclass
class ComponentState:
    name: str
    address: str
    pid: int | None
    state: str  # up | starting | down


def _run_dir(settings: Settings) -> Path:
    return settings.app.data_dir.resolve() / "run"


def _log_path(settings: Settings, name: str) -> Path:
    return settings.app.data_dir.resolve() / "logs" / f"{name}.log"


def _pidfile(settings: Settings, name: str) -> Path:
    return _run_dir(settings) / f"{name}.pid"


def running_process(settings: Settings, name: str) -> psutil.Process | None:
    """The live process a pidfile names, or None (a stale pidfile is removed)."""
    path = _pidfile(settings, name)
    if not path.exists():
        return None
    record = json.loads(path.read_text())
    try:
        process = psutil.Process(record["pid"])
        if (
            abs(process.create_time() - record["create_time"]) < 0.5
            and process.status() != psutil.STATUS_ZOMBIE
        ):
            return process
    except psutil.NoSuchProcess:
        pass
    path.unlink(missing_ok=True)
    return None


def _port_conflicts(components: list[Component]) -> list[str]:
    return [
        f"port {port.number} needed by {comp.name} is already in use; "
        f"choose another with {port.setting}=<port> (environment or .env)"
        for comp in components
        for port in comp.ports
        if not localstack.port_is_free(port.number)
    ]


def _start(settings: Settings, comp: Component) -> None:
    process = localstack.spawn(comp, _log_path(settings, comp.name))
    record = {
        "pid": process.pid,
        "create_time": psutil.Process(process.pid).create_time(),
        "argv": comp.argv,
    }
    _pidfile(settings, comp.name).write_text(json.dumps(record))

    def ready_or_exited() -> bool:
        return process.poll() is not None or comp.ready()

    localstack.wait_until(ready_or_exited, READY_TIMEOUT_S, interval_s=0.2)
    if process.poll() is not None or not comp.ready():
        tail = _log_path(settings, comp.name).read_text(errors="replace")[-2000:]
        raise StackError(
            f"{comp.name} did not become ready at {comp.address}; last log lines:\n{tail}"
        )


def up(settings: Settings) -> list[ComponentState]:
    """Start every component that is not running; all or nothing for this call."""
    _run_dir(settings).mkdir(parents=True, exist_ok=True)
    components = localstack.stack_components(settings)
    to_start = [comp for comp in components if running_process(settings, comp.name) is None]
    conflicts = _port_conflicts(to_start)
    if conflicts:
        raise StackError("nothing started:\n  " + "\n  ".join(conflicts))
    if any(comp.name in localstack.SERVICES for comp in to_start):
        _migrate(settings)
    started: list[str] = []
    try:
        for comp in to_start:
            started.append(comp.name)
            _start(settings, comp)
    except BaseException:
        for name in reversed(started):
            _stop(settings, name)
        raise
    return status(settings)


def _migrate(settings: Settings) -> None:
    # Schema changes before any service reads a table; imported late to keep `status` fast.
    from shared import db

    db.migrate(settings.database_url)


def _stop(settings: Settings, name: str) -> bool:
    process = running_process(settings, name)
    if process is None:
        return False
    group = os.getpgid(process.pid)
    os.killpg(group, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while (
        time.monotonic() < deadline
        and process.is_running()
        and process.status() != psutil.STATUS_ZOMBIE
    ):
        time.sleep(0.1)
    if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
        os.killpg(group, signal.SIGKILL)
        process.wait(STOP_TIMEOUT_S)
    _pidfile(settings, name).unlink(missing_ok=True)
    return True


def down(settings: Settings) -> list[str]:
    """Stop the components this data dir started, services first; returns the names stopped."""
    components = localstack.stack_components(settings)
    return [comp.name for comp in reversed(components) if _stop(settings, comp.name)]


def status(settings: Settings) -> list[ComponentState]:
    states = []
    for comp in localstack.stack_components(settings):
        process = running_process(settings, comp.name)
        if process is None:
            state = "down"
        else:
            state = "up" if comp.ready() else "starting"
        states.append(
            ComponentState(comp.name, comp.address, process.pid if process else None, state)
        )
    return states

"""A short process supervisor for the local stack: start in the background, stop exactly, report.

Each component of deploy/local/stack.yaml runs in its own session with its output in
`<data_dir>/logs/<name>.log` and a pidfile in `<data_dir>/run/` that records the process's
creation time, so `down` never signals a recycled pid. `up` refuses to half-start: every port
is checked first, and a component that does not become ready stops what this call started.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import psutil

from shared.dev import localstack
from shared.dev.localstack import Component
from shared.settings import Settings

READY_TIMEOUT_S = 90.0


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
    # The components run in the environment these settings were checked in, whatever the
    # caller's own TUNELOOP_ENV says (unset would make each service production).
    env: dict[str, str] = {"TUNELOOP_ENV": settings.app.env}
    process = localstack.spawn(comp, _log_path(settings, comp.name), env=env)
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
    started: list[Component] = []
    try:
        for comp in to_start:
            started.append(comp)
            _start(settings, comp)
    except BaseException:
        for comp in reversed(started):
            _stop(settings, comp)
        raise
    return status(settings)


def _migrate(settings: Settings) -> None:
    # Schema changes before any service reads a table; imported late to keep `status` fast.
    from shared import db

    db.migrate(settings.database_url)


def _alive(process: psutil.Process) -> bool:
    try:
        return bool(process.is_running() and process.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def _stop(settings: Settings, comp: Component) -> bool:
    """SIGTERM the component's process group, SIGKILL it after the component's grace period."""
    process = running_process(settings, comp.name)
    if process is None:
        return False
    group = os.getpgid(process.pid)
    os.killpg(group, signal.SIGTERM)
    deadline = time.monotonic() + comp.stop_timeout_s
    while time.monotonic() < deadline and _alive(process):
        time.sleep(0.1)
    if _alive(process):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
        with contextlib.suppress(psutil.NoSuchProcess, psutil.TimeoutExpired):
            process.wait(5)
    _pidfile(settings, comp.name).unlink(missing_ok=True)
    return True


def down(settings: Settings) -> list[str]:
    """Stop the components this data dir started, services first; returns the names stopped."""
    return stop(settings, [comp.name for comp in localstack.stack_components(settings)])


def stop(settings: Settings, names: Collection[str]) -> list[str]:
    """Stop the named components that are running, in reverse start order (services before what
    they use); returns the names stopped."""
    components = [c for c in localstack.stack_components(settings) if c.name in names]
    return [comp.name for comp in reversed(components) if _stop(settings, comp)]


def status(settings: Settings) -> list[ComponentState]:
    states = []
    for comp in localstack.stack_components(settings):
        process = running_process(settings, comp.name)
        state = "down" if process is None else "up" if comp.ready() else "starting"
        states.append(
            ComponentState(comp.name, comp.address, process.pid if process else None, state)
        )
    return states

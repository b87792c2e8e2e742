"""Where an attempt runs: the provider Protocol every rung of the GPU ladder implements, and the
local provider (a detached trainer process on this machine), the embedded default.

A provider knows nothing of jobs: it gets a trainer command and a work directory, and answers
where the attempt stands. Kubernetes and serverless providers are further small adapters of the
same four calls.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

import psutil

from services.scheduler.launcher import EXIT_FILE

AttemptState = Literal["running", "exited", "lost"]
LOG_FILE = "trainer.log"


@dataclass(frozen=True)
class Handle:
    """What a provider needs to find an attempt again, also after the scheduler restarted."""

    provider: str
    ref: str  # local: "<pid>:<process create time>"
    work_dir: str


@dataclass(frozen=True)
class Status:
    state: AttemptState
    returncode: int | None = None
    reason: str = ""


class Provider(Protocol):
    name: str

    def submit(self, argv: list[str], *, work_dir: Path, env: dict[str, str]) -> Handle: ...

    def poll(self, handle: Handle) -> Status: ...

    def cancel(self, handle: Handle, *, grace_s: float) -> Status: ...

    def logs(self, handle: Handle, *, tail_bytes: int = 20_000) -> str: ...


class LocalProvider:
    """The trainer as a detached process (its own session) under `services.scheduler.launcher`,
    which records the exit status in the work directory: the scheduler can restart meanwhile,
    and a process it did not start cannot be waited for."""

    name = "local"

    def submit(self, argv: list[str], *, work_dir: Path, env: dict[str, str]) -> Handle:
        work_dir.mkdir(parents=True, exist_ok=True)
        (work_dir / EXIT_FILE).unlink(missing_ok=True)
        launcher = [sys.executable, "-m", "services.scheduler.launcher", str(work_dir), "--", *argv]
        with (work_dir / LOG_FILE).open("ab") as log:
            process = subprocess.Popen(
                launcher,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        created = psutil.Process(process.pid).create_time()
        return Handle(self.name, f"{process.pid}:{created!r}", str(work_dir))

    def poll(self, handle: Handle) -> Status:
        recorded = _exit_record(Path(handle.work_dir))
        if recorded is not None:
            return recorded
        if _process(handle) is not None:
            return Status("running")
        # The launcher writes its record before it exits; without one the process was killed
        # (the machine rebooted, someone sent SIGKILL): the attempt is lost.
        return Status("lost", reason="the trainer process is gone and left no exit status")

    def cancel(self, handle: Handle, *, grace_s: float) -> Status:
        """SIGTERM (the trainer checkpoints and exits), SIGKILL after `grace_s`."""
        process = _process(handle)
        if process is not None:
            group = os.getpgid(process.pid)
            # To the launcher alone, which passes it on: a signal to the whole group would reach
            # the trainer twice, the second time perhaps after its handler is gone.
            with contextlib.suppress(psutil.Error):
                process.terminate()
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline and _alive(process):
                time.sleep(0.1)
            if _alive(process):
                _kill(process, group)
        return self.poll(handle)

    def logs(self, handle: Handle, *, tail_bytes: int = 20_000) -> str:
        path = Path(handle.work_dir) / LOG_FILE
        try:
            with path.open("rb") as log:
                log.seek(max(0, path.stat().st_size - tail_bytes))
                return log.read().decode(errors="replace")
        except FileNotFoundError:
            return ""


def _process(handle: Handle) -> psutil.Process | None:
    """The live launcher process, or None; a recycled pid (another start time) is not ours."""
    pid, _, created = handle.ref.partition(":")
    try:
        process = psutil.Process(int(pid))
        if abs(process.create_time() - float(created)) < 0.5 and _alive(process):
            return process
    except (psutil.Error, ValueError):
        pass
    return None


def _kill(launcher: psutil.Process, group: int) -> None:
    """SIGKILL the trainer, so the launcher still records how it ended; then anything left."""
    with contextlib.suppress(psutil.Error):
        for child in launcher.children(recursive=True):
            child.kill()
    with contextlib.suppress(psutil.Error):
        launcher.wait(5)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signal.SIGKILL)


def _alive(process: psutil.Process) -> bool:
    try:
        return bool(process.is_running() and process.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def _exit_record(work_dir: Path) -> Status | None:
    try:
        record = json.loads((work_dir / EXIT_FILE).read_text())
    except (FileNotFoundError, ValueError):
        return None
    code = int(record["returncode"])
    return Status("exited", code, str(record.get("reason", "")))

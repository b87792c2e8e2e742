"""Where an attempt runs: the provider Protocol every rung of the GPU ladder implements, and the
local provider (a detached trainer process on this machine), the embedded default.

A provider gets a `LaunchSpec` (the attempt's trainer config, the checkpoint to resume from, the
devices it needs) and answers where the attempt stands. Kubernetes (kubernetes_provider.py) and
SkyPilot (skypilot_provider.py) are further small adapters of the same four calls.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import psutil

from services.scheduler.launcher import EXIT_FILE

# pending: accepted by the provider, not running yet (a pod waiting for a node); preempted: the
# provider took the machine away (a spot reclaim, a node drained), which is not the trainer's
# fault and does not count against the job's retries.
AttemptState = Literal["pending", "running", "exited", "lost", "preempted"]
LOG_FILE = "trainer.log"
CONFIG_FILE = "job.json"
# What runs the trainer; the config path and the checkpoints to resume from are added.
TRAINER = ("python", "-m", "services.trainer", "run")


@dataclass(frozen=True)
class LaunchSpec:
    """One attempt of a job: everything a provider needs to run its trainer, wherever."""

    job_id: str
    attempt_id: str
    tenant: str
    # The trainer's job config (job.json): holds the job's webhook secret, so a provider keeps it
    # as a secret (a 0600 file, a Kubernetes Secret) and never logs it.
    config: dict[str, Any]
    # A local scratch directory for this attempt (the local provider runs the trainer there).
    work_dir: Path
    # A committed checkpoint to go on from (a URI), or None to start from the base model.
    resume_from: str | None = None
    # Older checkpoints the trainer tries in order when resume_from fails its sha256 check or
    # is gone (`--resume-fallback`); the first that verifies is resumed from.
    resume_fallbacks: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    device: str = "cpu"
    device_count: int = 1
    # The provider's time limit for one attempt (the scheduler rolls over before it).
    max_runtime_s: float | None = None
    command: tuple[str, ...] = TRAINER

    def trainer_argv(self, config_path: str) -> list[str]:
        argv = [*self.command, "--config", config_path]
        if self.resume_from:
            argv += ["--resume-from", self.resume_from]
            for fallback in self.resume_fallbacks:
                argv += ["--resume-fallback", fallback]
        return argv


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

    def submit(self, spec: LaunchSpec) -> Handle: ...

    def poll(self, handle: Handle) -> Status: ...

    def cancel(self, handle: Handle, *, grace_s: float) -> Status: ...

    def logs(self, handle: Handle, *, tail_bytes: int = 20_000) -> str: ...


class LocalProvider:
    """The trainer as a detached process (its own session) under `services.scheduler.launcher`,
    which records the exit status in the work directory: the scheduler can restart meanwhile,
    and a process it did not start cannot be waited for."""

    def __init__(self, name: str = "local") -> None:
        self.name = name

    def submit(self, spec: LaunchSpec) -> Handle:
        work_dir = spec.work_dir
        work_dir.mkdir(parents=True, exist_ok=True)
        (work_dir / EXIT_FILE).unlink(missing_ok=True)
        config_path = work_dir / CONFIG_FILE
        config_path.write_text(json.dumps(spec.config))
        config_path.chmod(0o600)  # it holds the job's webhook secret
        argv = spec.trainer_argv(str(config_path))
        if argv[0] == "python":  # this interpreter, whose environment has the trainer
            argv[0] = sys.executable
        env = {**os.environ, **spec.env}
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

"""The SkyPilot rung of the GPU ladder: each attempt is a SkyPilot managed job (`sky.jobs.launch`),
so SkyPilot finds the GPUs (any cloud it is set up for, or Kubernetes) and brings the job back
after a spot preemption.

SkyPilot recovers a preempted job by running the task's run command again on a new cluster, from
scratch; the run command therefore asks the trainer for the attempt's latest checkpoint. SkyPilot
reports no exit status, so the run command prints the trainer's as its last line. The `sky` module
is imported when a provider is built, so the scheduler runs without SkyPilot until a rung needs it.
"""

from __future__ import annotations

import importlib
import inspect
import io
import json
import math
import re
import shlex
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol, cast

from services.scheduler.ladder import ProviderSpec, SkyPilotOptions
from services.scheduler.providers import AttemptState, Handle, LaunchSpec, Status

# The trainer config travels as a SkyPilot secret (redacted in SkyPilot's YAML, logs and
# dashboard); the run command writes it to a private file and drops the variable.
CONFIG_SECRET = "TUNELOOP_JOB_CONFIG"  # noqa: S105 -- a variable's name, not a secret
# Relative to the run command's directory (the synced workdir, or the home directory).
CONFIG_PATH = ".tuneloop/job.json"
# The trainer's `--resume-from latest`: the newest checkpoint committed under the attempt's own
# output prefix that verifies, or step 0 when there is none yet (services/trainer/resume.py).
RESUME_LATEST = "latest"
# The trainer option naming a checkpoint `latest` falls back to (repeatable, tried in order):
# the attempt's own `resume_from` and `resume_fallbacks`, for the first run of the attempt and
# for one whose own checkpoints all fail their check.
RESUME_FALLBACK_OPTION = "--resume-fallback"
# On a preemption, relaunch in another region first (the one just lost is likely short of spot
# capacity). User-code failures are never retried by SkyPilot: the scheduler owns retries.
JOB_RECOVERY = {"strategy": "EAGER_NEXT_REGION", "max_restarts_on_errors": 0}
# The run command's last line; its number is the trainer's exit status (the only place it shows).
EXIT_MARKER = "tuneloop-trainer-exit-code="
# A failed job whose exit line was not found (setup failed, no resources, the log is gone).
UNKNOWN_FAILURE = 1
# A job cancelled in SkyPilot: never a success, as if the trainer died of SIGTERM.
CANCELLED = 128 + 15
# After `max_runtime_s`, the trainer gets SIGTERM (it checkpoints) and this long before SIGKILL.
STOP_GRACE_S = 300
# SkyPilot tails whole lines; a line is rarely shorter than this (the trainer's are JSON records).
MIN_LINE_BYTES = 40
# How much of the log is searched for the exit line, and how often cancel looks again.
EXIT_SCAN_BYTES = 4_000
CANCEL_POLL_S = 5.0


class SkyPilotUnavailable(RuntimeError):
    """`sky` cannot be imported, or is too old; the message says what to install."""


class SkyPilotConfigError(ValueError):
    """The provider's options cannot make a SkyPilot task; the message names the option."""


class SkyTask(Protocol):
    def set_resources(self, resources: Any) -> Any: ...


class SkyJobs(Protocol):
    """`sky.jobs`, the managed jobs SDK: each call returns a request id for `sky.get`, except
    tail_logs, which writes to `output_stream`."""

    def launch(self, task: Any, name: str | None = None) -> Any: ...

    def queue(
        self,
        refresh: bool,
        skip_finished: bool = False,
        all_users: bool = False,
        job_ids: list[int] | None = None,
    ) -> Any: ...

    def cancel(self, name: str | None = None, job_ids: list[int] | None = None) -> Any: ...

    def tail_logs(
        self,
        name: str | None = None,
        job_id: int | None = None,
        follow: bool = True,
        controller: bool = False,
        refresh: bool = False,
        tail: int | None = None,
        output_stream: Any = None,
    ) -> int | None: ...


class Sky(Protocol):
    """The part of the `sky` package this provider uses (tests pass tests/fakes/sky)."""

    @property
    def jobs(self) -> SkyJobs: ...

    def Task(  # SkyPilot's class
        self,
        name: str | None = None,
        *,
        setup: str | None = None,
        run: str | None = None,
        envs: dict[str, str] | None = None,
        secrets: dict[str, str] | None = None,
        workdir: str | None = None,
    ) -> SkyTask: ...

    def Resources(  # SkyPilot's class
        self,
        *,
        accelerators: str | None = None,
        infra: str | None = None,
        use_spot: bool | None = None,
        image_id: str | None = None,
        job_recovery: dict[str, Any] | None = None,
    ) -> Any: ...

    def get(self, request_id: Any) -> Any: ...


def import_sky() -> Sky:
    try:
        module = importlib.import_module("sky")
    except ImportError as exc:
        raise SkyPilotUnavailable(
            "a provider of kind skypilot needs SkyPilot in the scheduler's environment: "
            "pip install 'skypilot[kubernetes]' (or [aws], [gcp], ... for the clouds it may "
            f"use), then `sky check` ({exc})"
        ) from None
    return cast(Sky, module)


class SkyPilotProvider:
    """One `ProviderSpec` of kind skypilot; the handle's ref is the managed job's id."""

    def __init__(
        self,
        spec: ProviderSpec,
        *,
        sky: Sky | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if spec.kind != "skypilot":
            raise SkyPilotConfigError(f"provider {spec.name} is of kind {spec.kind}, not skypilot")
        self.name = spec.name
        self.options = spec.skypilot or SkyPilotOptions()
        self._sky = sky if sky is not None else import_sky()
        self._clock, self._sleep = clock, sleep
        _require_secrets(self._sky)
        if self.options.accelerators is None:
            accelerators_for(spec.device, spec.device_count)  # refuse a bad rung at start

    def submit(self, spec: LaunchSpec) -> Handle:
        name = task_name(spec)
        task = self._sky.Task(
            name,
            setup=self.options.setup,
            run=run_command(spec),
            envs=dict(spec.env),
            secrets={CONFIG_SECRET: json.dumps(spec.config)},
            workdir=self.options.workdir,
        )
        task.set_resources(
            self._sky.Resources(
                accelerators=self.options.accelerators
                or accelerators_for(spec.device, spec.device_count),
                infra=self.options.infra,
                use_spot=self.options.use_spot,
                image_id=self.options.image_id,
                job_recovery=dict(JOB_RECOVERY),
            )
        )
        launched = self._sky.get(self._sky.jobs.launch(task, name=name))
        return Handle(self.name, str(_job_id(launched)), str(spec.work_dir))

    def poll(self, handle: Handle) -> Status:
        record = self._record(handle)
        if record is None:
            return Status("lost", reason=f"SkyPilot has no managed job {handle.ref}")
        name = _status_name(record.get("status"))
        if name == "FAILED":
            return _failed(name, record, self._exit_code(handle))
        return status_of(name, record)

    def cancel(self, handle: Handle, *, grace_s: float) -> Status:
        """Ask SkyPilot to cancel, then wait up to `grace_s` for it to finish.

        SkyPilot's jobs controller tears the job's cluster down; the trainer gets no reliable
        SIGTERM first (a Kubernetes pod's is not passed on to the job either), so nothing waits
        for a checkpoint: `grace_s` only bounds how long this waits to see the job end, and the
        next attempt goes on from the last checkpoint the trainer committed by itself."""
        self._sky.get(self._sky.jobs.cancel(job_ids=[int(handle.ref)]))
        deadline = self._clock() + grace_s
        status = self.poll(handle)
        while status.state in ("running", "pending") and self._clock() < deadline:
            self._sleep(min(CANCEL_POLL_S, max(0.0, deadline - self._clock())))
            status = self.poll(handle)
        return status

    def logs(self, handle: Handle, *, tail_bytes: int = 20_000) -> str:
        stream = io.StringIO()
        try:
            self._sky.jobs.tail_logs(
                job_id=int(handle.ref),
                follow=False,
                tail=tail_bytes // MIN_LINE_BYTES + 1,
                output_stream=stream,
            )
        # Logs only explain a failure already known: the controller being away must not stop
        # the scheduler from recording it (SkyPilot raises many exception types here).
        except Exception as exc:
            return f"(SkyPilot logs of managed job {handle.ref} unavailable: {exc})"
        return stream.getvalue().encode()[-tail_bytes:].decode(errors="replace")

    def _record(self, handle: Handle) -> dict[str, Any] | None:
        # all_users: the scheduler's SkyPilot user may differ after it restarts elsewhere.
        request = self._sky.jobs.queue(
            refresh=False, skip_finished=False, all_users=True, job_ids=[int(handle.ref)]
        )
        result = self._sky.get(request)
        # A (records, total, counts, total unfiltered) tuple from some SkyPilot releases.
        records = result[0] if isinstance(result, tuple) else result
        for record in records:
            if str(record.get("job_id")) == handle.ref:
                return {
                    key: record.get(key) for key in ("status", "failure_reason", "recovery_count")
                }
        return None

    def _exit_code(self, handle: Handle) -> int:
        found = re.findall(rf"{EXIT_MARKER}(\d+)", self.logs(handle, tail_bytes=EXIT_SCAN_BYTES))
        return int(found[-1]) if found else UNKNOWN_FAILURE


def task_name(spec: LaunchSpec) -> str:
    return f"tuneloop-{spec.attempt_id}"


def run_command(spec: LaunchSpec) -> str:
    """The task's run command: the config from the secret to a private file, then the trainer,
    then its exit status as the last line of the log."""
    trainer = shlex.join(trainer_argv(spec))
    if spec.max_runtime_s is not None:
        # The scheduler rolls over before the limit; this stops a run it failed to reach.
        limit = math.ceil(spec.max_runtime_s)
        trainer = f"timeout --signal=TERM --kill-after={STOP_GRACE_S} {limit} {trainer}"
    return "\n".join(
        [
            "set -u",
            "umask 077",
            "mkdir -p .tuneloop",
            # printf is a shell builtin: the config never appears in a process's arguments.
            f'printf "%s" "${CONFIG_SECRET}" > {CONFIG_PATH}',
            f"unset {CONFIG_SECRET}",
            "code=0",
            f"{trainer} || code=$?",
            f'echo "{EXIT_MARKER}$code"',
            'exit "$code"',
        ]
    )


def trainer_argv(spec: LaunchSpec) -> list[str]:
    """The trainer's arguments for every run of the attempt: the first, and each one SkyPilot
    starts again after a preemption, which must go on from what the attempt committed. So
    `latest` first, then the checkpoints the attempt was given, as fallbacks."""
    argv = replace(spec, resume_from=None, resume_fallbacks=()).trainer_argv(CONFIG_PATH)
    argv += ["--resume-from", RESUME_LATEST]
    for checkpoint in (spec.resume_from, *spec.resume_fallbacks):
        if checkpoint:
            argv += [RESUME_FALLBACK_OPTION, checkpoint]
    return argv


def accelerators_for(device: str, count: int) -> str | None:
    """SkyPilot's accelerators for a ladder device class: none for cpu; `nvidia-<name>` is
    `<NAME>:<count>` (nvidia-h100 -> H100:1, nvidia-a100-80gb -> A100-80GB:1, nvidia-l4 -> L4:1),
    which is SkyPilot's naming for data-centre GPUs. Others need `skypilot.accelerators`."""
    if device == "cpu":
        return None
    if device.startswith("nvidia-"):
        return f"{device.removeprefix('nvidia-').upper()}:{count}"
    raise SkyPilotConfigError(
        f"device {device!r} has no SkyPilot accelerator name by rule: set the provider's "
        "`skypilot.accelerators` (e.g. 'L4:1', or 'A100-80GB:2')"
    )


# ManagedJobStatus (sky/jobs/state.py) by name -> our state and why. RECOVERING is not
# `preempted`: SkyPilot itself is bringing the job back (the run resumes from the latest
# checkpoint), and a new attempt of ours would run beside it.
_LIVE: dict[str, tuple[AttemptState, str]] = {
    "PENDING": ("pending", "waiting for a SkyPilot jobs controller"),
    "SUBMITTED": ("pending", "submitted to the SkyPilot jobs controller"),
    "STARTING": ("pending", "SkyPilot is provisioning the job's cluster"),
    "RUNNING": ("running", ""),
    "WINDING_DOWN": ("running", ""),
    "RECOVERING": ("pending", "SkyPilot is recovering the job after losing its cluster"),
    "CANCELLING": ("running", "SkyPilot is cancelling the job"),
}


def status_of(name: str, record: dict[str, Any]) -> Status:
    """Every status but FAILED, whose exit code is in the log."""
    if name == "SUCCEEDED":
        return Status("exited", 0)
    if name == "CANCELLED":
        return Status("exited", CANCELLED, "cancelled in SkyPilot")
    if name.startswith("FAILED"):
        return _failed(name, record, UNKNOWN_FAILURE)
    state, reason = _LIVE.get(name, ("pending", f"SkyPilot reports status {name}"))
    if name == "RECOVERING":
        reason += f" (recovery {record.get('recovery_count') or 0})"
    return Status(state, reason=reason)


def _failed(name: str, record: dict[str, Any], code: int) -> Status:
    detail = record.get("failure_reason")
    return Status("exited", code, f"SkyPilot {name}" + (f": {detail}" if detail else ""))


def _status_name(status: Any) -> str:
    # A ManagedJobStatus, or its value where a record went through JSON.
    return str(getattr(status, "value", status))


def _job_id(launched: Any) -> int:
    # (job id, controller handle); newer releases give a list of job ids (pools launch several).
    job_id = launched[0]
    if isinstance(job_id, list):
        if len(job_id) != 1:
            raise RuntimeError(f"sky.jobs.launch started {len(job_id)} jobs, not one")
        job_id = job_id[0]
    return int(job_id)


def _require_secrets(sky: Sky) -> None:
    """Refuse a SkyPilot whose Task has no `secrets`: the config would have to go in `envs`,
    which SkyPilot prints."""
    try:
        parameters = inspect.signature(sky.Task).parameters
    except (TypeError, ValueError):  # not introspectable: trust it
        return
    if "secrets" not in parameters:
        raise SkyPilotUnavailable(
            "this SkyPilot's sky.Task takes no `secrets`; upgrade: pip install -U skypilot"
        )

"""The fake's objects: Task and Resources with SkyPilot's checks, and the jobs controller."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

from tests.fakes.sky.status import ManagedJobStatus

# sky/task.py's rule for task (and so managed job) names.
_VALID_NAME = re.compile(r"[a-z0-9]+(?:[._-]{1,2}[a-z0-9]+)*")
_ACCELERATORS = re.compile(r"[A-Za-z0-9-]+(:[0-9]+)?")
_STRATEGIES = {"FAILOVER", "EAGER_NEXT_REGION"}
_RECOVERY_KEYS = {"strategy", "max_restarts_on_errors", "recover_on_exit_codes"}


class Resources:
    def __init__(
        self,
        *,
        accelerators: str | None = None,
        infra: str | None = None,
        use_spot: bool | None = None,
        image_id: str | None = None,
        job_recovery: dict[str, Any] | None = None,
    ) -> None:
        if accelerators is not None and not _ACCELERATORS.fullmatch(accelerators):
            raise ValueError(f"invalid accelerators {accelerators!r}")
        if infra is not None and not all(infra.split("/")):
            raise ValueError(f"invalid infra {infra!r}")
        if job_recovery is not None:
            unknown = set(job_recovery) - _RECOVERY_KEYS
            if unknown or job_recovery.get("strategy") not in _STRATEGIES:
                raise ValueError(f"invalid job_recovery {job_recovery!r}")
        self.accelerators, self.infra, self.use_spot = accelerators, infra, bool(use_spot)
        self.image_id, self.job_recovery = image_id, job_recovery


class Task:
    def __init__(
        self,
        name: str | None = None,
        *,
        setup: str | None = None,
        run: str | None = None,
        envs: dict[str, str] | None = None,
        secrets: dict[str, str] | None = None,
        workdir: str | None = None,
    ) -> None:
        if name is not None and not _VALID_NAME.fullmatch(name):
            raise ValueError(f"Invalid task name {name}")
        for kind, values in (("envs", envs or {}), ("secrets", secrets or {})):
            if not all(isinstance(v, str) for v in values.values()):
                raise ValueError(f"{kind} values must be strings")
        self.name, self.setup, self.run, self.workdir = name, setup, run, workdir
        self.envs = dict(envs or {})
        self.secrets = dict(secrets or {})
        self.resources: Resources | None = None

    def set_resources(self, resources: Resources) -> Task:
        self.resources = resources
        return self

    def validate(self) -> None:
        """What `sky.jobs.launch` checks on the client before sending the task."""
        if not isinstance(self.run, str):
            raise ValueError("run must be a shell script (str)")
        if self.workdir is not None and not os.path.isdir(os.path.expanduser(self.workdir)):
            raise ValueError(f"Workdir must be a valid directory. {self.workdir} not found.")

    def to_yaml_config(self, use_user_specified_yaml: bool = False) -> dict[str, Any]:
        """SkyPilot's dump; `use_user_specified_yaml=True` is what it shows (secrets redacted)."""
        secrets = dict(self.secrets)
        if use_user_specified_yaml:
            secrets = dict.fromkeys(secrets, "<redacted>")
        resources = self.resources
        return {
            "name": self.name,
            "setup": self.setup,
            "run": self.run,
            "envs": dict(self.envs),
            "secrets": secrets,
            "workdir": self.workdir,
            "resources": vars(resources) if resources is not None else {},
        }


@dataclass
class FakeJob:
    job_id: int
    name: str
    task: Task
    status: ManagedJobStatus = ManagedJobStatus.PENDING
    log: str = ""
    failure_reason: str | None = None
    recovery_count: int = 0
    # After `sky.jobs.cancel`: queue calls it stays CANCELLING before it is CANCELLED (a job a
    # test set CANCELLING stays so).
    cancelling_polls: int | None = None


@dataclass
class Controller:
    """The jobs controller and the API server's requests, in memory."""

    jobs: dict[int, FakeJob] = field(default_factory=dict)
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    requests: dict[str, Any] = field(default_factory=dict)
    # Shapes of other SkyPilot releases: launch's job ids as a list; queue as a 4-tuple.
    launch_returns_list: bool = True
    queue_returns_tuple: bool = False
    cancel_polls: int = 1

    def reset(self) -> None:
        self.jobs.clear()
        self.calls.clear()
        self.requests.clear()
        self.launch_returns_list, self.queue_returns_tuple, self.cancel_polls = True, False, 1

    def request(self, result: Any) -> str:
        request_id = f"request-{len(self.requests) + 1}"
        self.requests[request_id] = result
        return request_id

    def add_job(self, name: str, task: Task) -> FakeJob:
        job = FakeJob(job_id=len(self.jobs) + 1, name=name, task=task)
        self.jobs[job.job_id] = job
        return job

    def set_status(
        self,
        job_id: int,
        status: ManagedJobStatus,
        *,
        failure_reason: str | None = None,
        log: str | None = None,
        recovery_count: int | None = None,
    ) -> None:
        job = self.jobs[job_id]
        job.status, job.failure_reason = status, failure_reason
        if log is not None:
            job.log = log
        if recovery_count is not None:
            job.recovery_count = recovery_count

    def calls_of(self, name: str) -> list[dict[str, Any]]:
        return [arguments for called, arguments in self.calls if called == name]


controller = Controller()


def get(request_id: str) -> Any:
    if request_id not in controller.requests:
        raise ValueError(f"API server: no request {request_id}")
    return controller.requests[request_id]


def stream_and_get(request_id: str) -> Any:
    return get(request_id)

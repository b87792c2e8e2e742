"""`sky.jobs`: launch, queue, cancel and tail_logs of managed jobs, against the fake controller."""

from __future__ import annotations

import sys
from typing import Any, TextIO

from tests.fakes.sky import core
from tests.fakes.sky.core import FakeJob, Task
from tests.fakes.sky.status import ManagedJobStatus

__all__ = ["ManagedJobStatus", "cancel", "launch", "queue", "tail_logs"]


def launch(task: Task, name: str | None = None) -> str:
    core.controller.calls.append(("launch", {"task": task, "name": name}))
    task.validate()
    job = core.controller.add_job(name or task.name or "sky-managed", task)
    job_ids: Any = [job.job_id] if core.controller.launch_returns_list else job.job_id
    return core.controller.request((job_ids, None))


def queue(
    refresh: bool,
    skip_finished: bool = False,
    all_users: bool = False,
    job_ids: list[int] | None = None,
) -> str:
    core.controller.calls.append(
        (
            "queue",
            {
                "refresh": refresh,
                "skip_finished": skip_finished,
                "all_users": all_users,
                "job_ids": job_ids,
            },
        )
    )
    records = []
    for job in core.controller.jobs.values():
        _advance_cancel(job)
        if job_ids is not None and job.job_id not in job_ids:
            continue
        if skip_finished and job.status.is_terminal():
            continue
        records.append(
            {
                "job_id": job.job_id,
                "job_name": job.name,
                "task_id": 0,
                "status": job.status,
                "failure_reason": job.failure_reason,
                "recovery_count": job.recovery_count,
            }
        )
    if core.controller.queue_returns_tuple:
        return core.controller.request((records, len(records), {}, len(core.controller.jobs)))
    return core.controller.request(records)


def cancel(
    name: str | None = None,
    job_ids: list[int] | None = None,
    all: bool = False,  # SkyPilot's parameter name
    all_users: bool = False,
) -> str:
    core.controller.calls.append(("cancel", {"name": name, "job_ids": job_ids, "all": all}))
    for job_id in job_ids or []:
        job = core.controller.jobs.get(job_id)
        if job is not None and not job.status.is_terminal():
            job.status, job.cancelling_polls = (
                ManagedJobStatus.CANCELLING,
                core.controller.cancel_polls,
            )
    return core.controller.request(None)


def tail_logs(
    name: str | None = None,
    job_id: int | None = None,
    follow: bool = True,
    controller: bool = False,  # the controller's own log: not faked
    refresh: bool = False,
    tail: int | None = None,
    output_stream: TextIO | None = None,
) -> int | None:
    core.controller.calls.append(("tail_logs", {"job_id": job_id, "follow": follow, "tail": tail}))
    job = core.controller.jobs.get(job_id or 0)
    if job is None:
        raise ValueError(f"No managed job {job_id} found")
    lines = job.log.splitlines(keepends=True)
    if tail is not None and tail > 0:
        lines = lines[-tail:]
    (output_stream or sys.stdout).write("".join(lines))
    return None if not follow else 0


def _advance_cancel(job: FakeJob) -> None:
    if job.status is ManagedJobStatus.CANCELLING and job.cancelling_polls is not None:
        if job.cancelling_polls <= 0:
            job.status = ManagedJobStatus.CANCELLED
        job.cancelling_polls -= 1

"""A stand-in for the `sky` package (SkyPilot's Python SDK), the subset the SkyPilot provider uses:
`Task` and `Resources` (checked as SkyPilot checks them), request ids resolved by `get`, and
`sky.jobs` over an in-memory jobs controller (`controller`) that records every call and lets a test
set a job's status and log. Call `controller.reset()` between tests."""

from tests.fakes.sky import jobs
from tests.fakes.sky.core import (
    Controller,
    FakeJob,
    Resources,
    Task,
    controller,
    get,
    stream_and_get,
)
from tests.fakes.sky.jobs import ManagedJobStatus

__all__ = [
    "Controller",
    "FakeJob",
    "ManagedJobStatus",
    "Resources",
    "Task",
    "controller",
    "get",
    "jobs",
    "stream_and_get",
]

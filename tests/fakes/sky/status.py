"""`sky.jobs.ManagedJobStatus` as sky/jobs/state.py defines it (values are the names)."""

from __future__ import annotations

import enum


class ManagedJobStatus(enum.Enum):
    PENDING = "PENDING"
    DEPRECATED_SUBMITTED = "SUBMITTED"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    WINDING_DOWN = "WINDING_DOWN"
    RECOVERING = "RECOVERING"
    CANCELLING = "CANCELLING"
    SUCCEEDED = "SUCCEEDED"
    CANCELLED = "CANCELLED"
    FAILED = "FAILED"
    FAILED_SETUP = "FAILED_SETUP"
    FAILED_PRECHECKS = "FAILED_PRECHECKS"
    FAILED_NO_RESOURCE = "FAILED_NO_RESOURCE"
    FAILED_CONTROLLER = "FAILED_CONTROLLER"

    def is_terminal(self) -> bool:
        return self in _TERMINAL


_TERMINAL = {
    ManagedJobStatus.SUCCEEDED,
    ManagedJobStatus.CANCELLED,
    ManagedJobStatus.FAILED,
    ManagedJobStatus.FAILED_SETUP,
    ManagedJobStatus.FAILED_PRECHECKS,
    ManagedJobStatus.FAILED_NO_RESOURCE,
    ManagedJobStatus.FAILED_CONTROLLER,
}

"""shared.processes: CPU classes for background processes, checked in a child process (a class,
once lowered, is not raised again without privileges)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from shared.processes import CpuClass

_PROBE = """
import os, sys, threading
from shared.processes import lower_cpu_priority
before = os.getpriority(os.PRIO_PROCESS, 0)
lower_cpu_priority(sys.argv[1])
seen = {}
thread = threading.Thread(target=lambda: seen.update(policy=os.sched_getscheduler(0)))
thread.start(); thread.join()
print(os.sched_getscheduler(0), seen["policy"], os.getpriority(os.PRIO_PROCESS, 0) - before)
"""


@pytest.mark.parametrize(
    ("cpu_class", "niced"), [("idle", 0), ("nice", 10), ("batch", 0), ("normal", 0)]
)
def test_lower_cpu_priority_sets_the_class_for_the_process_and_its_later_threads(
    cpu_class: CpuClass, niced: int
) -> None:
    # "nice" and "normal" keep the policy the child inherits (SCHED_IDLE under `chrt --idle`),
    # and so does "batch" where that is SCHED_IDLE.
    policy = inherited = os.sched_getscheduler(0)
    if cpu_class == "idle":
        policy = os.SCHED_IDLE
    elif cpu_class == "batch" and inherited == os.SCHED_OTHER:
        policy = os.SCHED_BATCH
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, cpu_class], capture_output=True, text=True, check=True
    ).stdout.split()
    assert [int(v) for v in out] == [policy, policy, niced]

"""Processes of this machine: whether another one is alive, and how this one dies with its
parent, yields the CPU and keeps its collector cheap."""

from __future__ import annotations

import ctypes
import gc
import os
import secrets
import signal
import sys
from dataclasses import dataclass
from functools import cache
from typing import Literal

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (ours or another user's); false for pid <= 0."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def start_mark(pid: int) -> str | None:
    """When the process with this pid started, as the kernel counts it (clock ticks since boot,
    /proc/<pid>/stat field 22); None when no such process runs or there is no /proc."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after it.
    fields = stat[stat.rfind(b")") + 2 :].split()
    return fields[19].decode() if len(fields) > 19 else None


@dataclass(frozen=True, slots=True)
class Incarnation:
    """One run of a process: its pid and when it started. A pid alone is not enough: a container
    restarts its process under the same pid, so files named by pid would be taken for the new
    process's own. Without /proc (not Linux) the mark is random, and `alive` falls back to the
    pid, which such systems do not reuse this quickly."""

    pid: int
    mark: str

    @property
    def name(self) -> str:
        return f"{self.pid}.{self.mark}"

    @classmethod
    def parse(cls, name: str) -> Incarnation | None:
        pid, dot, mark = name.partition(".")
        if not (pid.isdigit() and dot and mark.isalnum()):
            return None
        return cls(int(pid), mark)

    def alive(self) -> bool:
        if not pid_alive(self.pid):
            return False
        mark = start_mark(self.pid)
        return mark is None or mark == self.mark or not self.mark.isdigit()


def this_incarnation() -> Incarnation:
    return _incarnation(os.getpid())  # by pid: a forked child is an incarnation of its own


@cache
def _incarnation(pid: int) -> Incarnation:
    return Incarnation(pid, start_mark(pid) or secrets.token_hex(6))


def die_with_parent(parent_pid: int, sig: signal.Signals = signal.SIGTERM) -> None:
    """Have the kernel send `sig` to this process when the process that started it dies (Linux;
    elsewhere a no-op), so a SIGKILLed service leaves no child behind. `parent_pid` is the pid
    the parent gave: if this process has been re-parented already, the parent died before the
    request could take effect, and this process exits at once."""
    if sys.platform != "linux":
        return
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, sig)
    if os.getppid() != parent_pid:
        os._exit(1)


CpuClass = Literal["idle", "nice", "batch", "normal"]


def lower_cpu_priority(cpu_class: CpuClass) -> None:
    """Put this process behind the machine's latency-sensitive work, for background processes
    that can catch up later. "idle" (Linux SCHED_IDLE) runs it only on a core nothing else
    wants, and a woken normal process takes the core from it at once; "nice" (nice 10) only
    weighs it down, so it still takes its share of a busy core. "batch" (Linux SCHED_BATCH)
    keeps its full share but marks it CPU-bound: when it wakes it does not preempt the process
    on the core, so processes working through batches on shared cores switch less often.
    Threads started afterwards inherit the class: call it first thing. A process already idle
    stays idle (it is lower than batch, and leaving SCHED_IDLE takes privileges)."""
    if cpu_class == "idle":
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    elif cpu_class == "batch":
        if os.sched_getscheduler(0) == os.SCHED_OTHER:
            os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    elif cpu_class == "nice":
        os.nice(10)


# Collections of the youngest generation after this many net allocations (CPython: 700).
_BATCH_GEN0_THRESHOLD = 50_000


def settle_heap(*, batch: bool = False) -> None:
    """Take what is alive now (modules, settings, clients made at start-up) out of the cyclic
    collector's reach: unfrozen, the ~150k start-up objects were rescanned by every full
    collection, ~100 ms each, every second or two in a busy shipper. Call it once start-up is
    done. `batch`: also collect young objects far less often, for a process that works in
    batches (shipper, persister, OTLP mapping) and whose objects die by reference count anyway:
    short-lived ones then rarely live long enough to be promoted, which is what brings the
    full collections on."""
    gc.collect()
    gc.freeze()
    if batch:
        _, *older = gc.get_threshold()
        gc.set_threshold(_BATCH_GEN0_THRESHOLD, *older)

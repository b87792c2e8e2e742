"""Torch threads by the cores other processes leave free, for CPU training beside an eval engine.

On a CPU box the job's eval engine (one thread) scores each checkpoint while training goes on. A
trainer holding one OpenMP thread per core then shares a core with the engine, and every
parallel region waits for its slowest thread: measured on the 2-core box, SmolLM2 LoRA steps of
~1.2 s took 4-5.4 s while an eval point ran, and the eval itself took 21 s instead of 15. With
one thread while the engine runs the steps took ~1.95 s and the eval 15 s; outside eval windows
the trainer is back on every core. So after each step the trainer reads how much CPU the other
processes used during it (the machine's busy time less its own) and sets its threads to the
cores left, at least one and at most what the job allows. A trainer alone never changes, and
GPU training does not need it (the scheduler asks for it on CPU rungs only).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import psutil
import torch

log = logging.getLogger("tuneloop.trainer.cpu_share")


@dataclass(frozen=True)
class CpuClock:
    """CPU seconds the whole machine was busy, those this process used, and the wall clock."""

    busy_s: float
    own_s: float
    wall_s: float


def read_clock() -> CpuClock:
    machine = psutil.cpu_times()
    busy = machine.user + machine.nice + machine.system + machine.irq + machine.softirq
    own = psutil.Process().cpu_times()
    return CpuClock(busy, own.user + own.system, time.monotonic())


def threads_for(others: float, cores: int, limit: int) -> int:
    """The threads to run: the cores the other processes leave (`others` cores busy on
    average), at least one, at most `limit`."""
    return max(1, min(limit, cores - round(others)))


class CoreShare:
    """Re-reads the machine after each step and sets torch's threads to the cores left."""

    def __init__(
        self,
        limit: int,
        cores: int,
        read: Callable[[], CpuClock] = read_clock,
        set_threads: Callable[[int], None] = torch.set_num_threads,
    ) -> None:
        self.limit, self.cores, self.read, self.set_threads = limit, cores, read, set_threads
        self.threads = limit
        self.last = read()

    def after_step(self) -> int:
        """The threads for the next step (changed only when the cores left differ)."""
        now = self.read()
        wall = now.wall_s - self.last.wall_s
        if wall > 0:
            others = max(0.0, (now.busy_s - self.last.busy_s) - (now.own_s - self.last.own_s))
            wanted = threads_for(others / wall, self.cores, self.limit)
            if wanted != self.threads:
                log.info(
                    "torch threads %d -> %d: other processes used %.1f of %d cores",
                    self.threads, wanted, others / wall, self.cores,
                )  # fmt: skip
                self.set_threads(wanted)
                self.threads = wanted
        self.last = now
        return self.threads

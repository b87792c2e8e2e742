"""Torch threads by the cores other processes leave free: CPU training beside an eval engine, and
the engine beside training.

On a CPU box the job's eval engine (one thread) scores each checkpoint while training goes on. A
trainer holding one OpenMP thread per core then shares a core with the engine, and every
parallel region waits for its slowest thread: measured on the 2-core box, SmolLM2 LoRA steps of
~1.2 s took 4-5.4 s while an eval point ran, and the eval itself took 21 s instead of 15. With
one thread while the engine runs the steps took ~1.95 s and the eval 15 s; outside eval windows
the trainer is back on every core. So after each step the trainer reads how much CPU the other
processes used during it (the machine's busy time less its own) and sets its threads to the
cores left, at least one and at most what the job allows. A trainer alone never changes, and
GPU training does not need it (the trainer applies it on CPU only).

Reacting after a step is too late for the eval itself: measured in `make demo`, the one
two-thread step an eval window caught took the whole window (~25 s: OpenMP threads spin at each
barrier while their partner waits for a core, thousands of barriers a step). The eval of a
checkpoint starts as soon as it is saved, so the trainer yields the core when it saves one, and
takes it back once the other work has come and gone (or has not come within `expect_s`).

The CPU engine (services/hoster/batching.py) applies the plain rule before each batch: one
thread while a trainer runs beside it, both cores once training has ended (the final eval and
the re-scoring of the top checkpoints), so neither waits on a core the other holds.

No torch import here: the caller passes its `torch.set_num_threads`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import psutil

log = logging.getLogger("tuneloop.cpu_share")


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
    """Re-reads the machine after each step and sets torch's threads to the cores left; yields
    a core when a checkpoint is saved, ahead of its eval."""

    def __init__(
        self,
        limit: int,
        cores: int,
        set_threads: Callable[[int], None],
        read: Callable[[], CpuClock] = read_clock,
        expect_s: float = 30.0,
        threads: int | None = None,
    ) -> None:
        """`threads`: what the process runs now (default `limit`)."""
        self.limit, self.cores, self.read, self.set_threads = limit, cores, read, set_threads
        self.expect_s = expect_s
        self.threads = threads or limit
        self.last = read()
        # After a checkpoint: until when an eval is awaited, and whether it has been seen.
        self.expecting_until: float | None = None
        self.seen_busy = False

    def checkpoint_saved(self) -> None:
        """Its eval starts now: one thread until that work has come and gone (the wait counts
        from the last step's end, a save's few seconds before)."""
        self.expecting_until = self.last.wall_s + self.expect_s
        self.seen_busy = False
        self._use(min(self.threads, self.cores - 1) or 1, "a checkpoint's eval is due")

    def update(self) -> int:
        """The threads for the next step or batch (changed only when the cores left differ)."""
        now = self.read()
        wall = now.wall_s - self.last.wall_s
        if wall > 0:
            others = (now.busy_s - self.last.busy_s) - (now.own_s - self.last.own_s)
            self._decide(max(0.0, others) / wall, now.wall_s)
        self.last = now
        return self.threads

    def _decide(self, others: float, now: float) -> None:
        if self.expecting_until is not None:
            self.seen_busy = self.seen_busy or others >= 0.5
            if not self.seen_busy and now < self.expecting_until:
                return  # still waiting for the eval to start
            if self.seen_busy and others >= 0.5:
                return  # it is running
            self.expecting_until = None
        wanted = threads_for(others, self.cores, self.limit)
        self._use(wanted, f"other processes used {others:.1f} of {self.cores} cores")

    def _use(self, threads: int, why: str) -> None:
        if threads != self.threads:
            log.info("torch threads %d -> %d: %s", self.threads, threads, why)
            self.set_threads(threads)
            self.threads = threads

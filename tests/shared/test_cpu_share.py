"""The trainer's threads follow the cores other processes leave free (cpu_share.py): a clock
that says how busy the machine was during each step decides; alone it never changes. (The
scheduler's JobConfig asks for it: the process tests that launch trainers validate that.)"""

from __future__ import annotations

from collections.abc import Iterator

import psutil

from shared.cpu_share import CoreShare, CpuClock, read_clock, threads_for


def test_threads_are_the_cores_left_at_least_one_at_most_the_limit() -> None:
    assert threads_for(0.0, cores=2, limit=2) == 2
    assert threads_for(0.4, cores=2, limit=2) == 2  # a gateway's trickle is not a core
    assert threads_for(1.0, cores=2, limit=2) == 1  # the eval engine's thread
    assert threads_for(2.7, cores=2, limit=2) == 1
    assert threads_for(1.0, cores=8, limit=4) == 4


def clocks(steps: list[tuple[float, float]]) -> Iterator[CpuClock]:
    """A machine where each 2-second step the trainer used `own` CPU seconds and the others
    `others`."""
    busy = own = wall = 0.0
    yield CpuClock(busy, own, wall)
    for mine, others in steps:
        busy, own, wall = busy + mine + others, own + mine, wall + 2.0
        yield CpuClock(busy, own, wall)


def test_the_trainer_yields_a_core_while_another_process_works_and_takes_it_back() -> None:
    # Alone on both cores, then an eval engine busy on one core for two steps, then alone.
    readings = clocks([(4.0, 0.0), (2.2, 2.0), (2.0, 1.9), (2.0, 0.1), (4.0, 0.0)])
    applied: list[int] = []
    share = CoreShare(2, 2, applied.append, read=lambda: next(readings))
    assert [share.update() for _ in range(5)] == [2, 1, 1, 2, 2]
    assert applied == [1, 2]  # torch is told only when the count changes


def test_the_real_clock_reads_this_process_inside_the_machine() -> None:
    first = read_clock()
    sum(i * i for i in range(200_000))  # some CPU of our own
    second = read_clock()
    assert second.wall_s > first.wall_s
    assert second.own_s >= first.own_s
    assert second.busy_s - first.busy_s >= 0
    assert psutil.cpu_count()


def test_a_saved_checkpoint_yields_the_core_until_its_eval_has_come_and_gone() -> None:
    # Saved; a step before the engine starts; two steps beside it; then it is done.
    readings = clocks([(1.0, 0.2), (2.0, 1.8), (2.0, 2.0), (4.0, 0.1), (4.0, 0.0)])
    applied: list[int] = []
    share = CoreShare(2, 2, applied.append, read=lambda: next(readings))
    before = share.threads
    share.checkpoint_saved()
    assert (before, share.threads) == (2, 1)
    assert [share.update() for _ in range(4)] == [1, 1, 1, 2]
    assert applied == [1, 2]


def test_no_eval_within_the_wait_gives_the_core_back() -> None:
    readings = clocks([(1.0, 0.0)] * 40)
    share = CoreShare(2, 2, lambda n: None, read=lambda: next(readings), expect_s=10.0)
    share.checkpoint_saved()
    threads = [share.update() for _ in range(8)]
    # Steps of 2 s: waiting while under 10 s have passed since the save, then both cores.
    assert threads == [1, 1, 1, 1, 2, 2, 2, 2]


def test_an_engine_starting_on_one_thread_takes_the_cores_a_finished_trainer_left() -> None:
    # The CPU engine: one thread at start; a batch beside a trainer (one core busy), then
    # batches after training has ended.
    readings = clocks([(2.0, 2.0), (2.0, 0.1), (4.0, 0.0)])
    applied: list[int] = []
    share = CoreShare(2, 2, applied.append, read=lambda: next(readings), threads=1)
    assert [share.update() for _ in range(3)] == [1, 2, 2]
    assert applied == [2]

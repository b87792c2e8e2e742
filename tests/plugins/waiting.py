"""Waiting in tests: poll a condition until it holds, or fail naming what was awaited once the
deadline passes. `eventually` in async tests (the event loop keeps running between looks),
`until` in sync ones (it also hands back what the check found)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


async def eventually(
    check: Callable[[], bool],
    timeout_s: float = 10.0,
    what: str = "the condition",
    *,
    every_s: float = 0.05,
) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:g} s"
        await asyncio.sleep(every_s)


def until(
    what: str,
    check: Callable[[], T | None],
    timeout_s: float = 180.0,
    *,
    every_s: float = 0.2,
    alive: Callable[[], bool] | None = None,
) -> T:
    """What `check` found once it is neither None nor False. `alive`: a process the wait is
    for; its end fails the wait at once."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if found is not None and found is not False:
            return found
        assert alive is None or alive(), f"{what}: the process ended first"
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:g} s"
        time.sleep(every_s)

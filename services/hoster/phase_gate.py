"""One model name's requests at a time on a base: an adapter is active for a whole batch."""

from __future__ import annotations

import asyncio
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager


class PhaseGate:
    """Requests for one model name run together; a request for another name waits until they
    drain, then `switch` activates its adapter. First come first served between names, so a
    steady stream for one model cannot starve another."""

    def __init__(self, switch: Callable[[str], None]) -> None:
        self._switch = switch
        self._cond = asyncio.Condition()
        self._active: str | None = None
        self._inflight = 0
        self._queue: deque[tuple[object, str]] = deque()

    @asynccontextmanager
    async def use(self, name: str) -> AsyncIterator[None]:
        async with self._enter(name, switch=True):
            yield

    @asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        """Nothing generates meanwhile (a name no request uses waits for every phase to end)."""
        async with self._enter(f"\0exclusive-{uuid.uuid4().hex}", switch=False):
            yield

    @asynccontextmanager
    async def _enter(self, name: str, *, switch: bool) -> AsyncIterator[None]:
        ticket = (object(), name)
        async with self._cond:
            self._queue.append(ticket)
            try:
                await self._cond.wait_for(lambda: self._may_enter(ticket))
            finally:
                self._queue.remove(ticket)
            if switch and self._active != name:
                self._switch(name)
                self._active = name
            self._inflight += 1
            self._cond.notify_all()  # requests for the same name behind this one may follow
        try:
            yield
        finally:
            async with self._cond:
                self._inflight -= 1
                self._cond.notify_all()

    @property
    def active(self) -> str | None:
        return self._active

    def forget(self, name: str, now_active: str) -> None:
        """name is gone (its adapter deleted under `exclusive`): now_active is what runs."""
        if self._active == name:
            self._active = now_active

    def _may_enter(self, ticket: tuple[object, str]) -> bool:
        if self._inflight == 0:
            return self._queue[0] is ticket
        if self._active != ticket[1]:
            return False
        for queued in self._queue:  # join the running phase unless another name waits ahead
            if queued is ticket:
                return True
            if queued[1] != ticket[1]:
                return False
        return True

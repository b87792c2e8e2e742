"""The journal shipper as a child of the ingest service (TUNELOOP_INGEST_SHIPPER=child).

With process capture a gateway only journals the calls it answered; `python -m
services.ingest.capture.shipper` turns them into samples (shipper.py). The shipper must run on the
gateway's machine, since the journal is a local directory, so by default the service runs it
itself: one child per service process, restarted when it exits on its own (after 1 s, doubling
up to 30 s while it keeps failing), stopped with SIGTERM when the service stops, and sent
SIGTERM by the kernel when the service dies without stopping it (`die_with_parent`). The
child's log lines go to the service's output.

With several worker processes each starts a child; the shipper's lock on the journal directory
makes the first the one that ships and the others standbys, one of which takes over if it dies.
TUNELOOP_INGEST_SHIPPER=external leaves running it to the operator (its own unit or container
on the same machine, or a benchmark that starts it itself).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import time

log = logging.getLogger("tuneloop.ingest.shipper")

# Tells the shipper which process to die with (shipper._main reads it).
PARENT_ENV = "TUNELOOP_INGEST_SHIPPER_PARENT"
_FIRST_DELAY_S, _MAX_DELAY_S = 1.0, 30.0
# A child that ran this long before exiting counts as healthy: the next restart is quick again.
_HEALTHY_S = 60.0


class ShipperChild:
    """Starts the shipper process, keeps it running, and stops it."""

    def __init__(self, *, stop_timeout_s: float = 15.0) -> None:
        self.stop_timeout_s = stop_timeout_s
        self.process: asyncio.subprocess.Process | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._stopping = False

    async def start(self) -> None:
        self._stopping = False
        await self._spawn()
        self._watcher = asyncio.create_task(self._watch(), name="shipper-child")

    async def stop(self) -> None:
        self._stopping = True
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
            self._watcher = None
        process, self.process = self.process, None
        if process is None or process.returncode is not None:
            return
        # SIGTERM: the shipper finishes the batch in hand and records how far it got.
        process.terminate()
        try:
            await asyncio.wait_for(process.wait(), self.stop_timeout_s)
        except TimeoutError:
            log.warning("the shipper did not stop within %.0fs; killing it", self.stop_timeout_s)
            process.kill()
            await process.wait()

    async def _spawn(self) -> None:
        env = {**os.environ, PARENT_ENV: str(os.getpid())}
        self.process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "services.ingest.capture.shipper", env=env
        )
        log.info("started the journal shipper (pid %d)", self.process.pid)

    async def _watch(self) -> None:
        delay = _FIRST_DELAY_S
        while not self._stopping:
            process = self.process
            if process is None:
                return
            started = time.monotonic()
            code = await process.wait()
            if self._stopping:
                return
            if time.monotonic() - started >= _HEALTHY_S:
                delay = _FIRST_DELAY_S
            # Waited out before saying anything: when the service is stopped with its process
            # group (make down, a container stop), the child gets the SIGTERM first and exits,
            # and stop() cancels this wait a moment later.
            await asyncio.sleep(delay)
            if self._stopping:
                return
            level = logging.WARNING if code == 0 else logging.ERROR  # 0: it was told to stop
            log.log(
                level,
                "the journal shipper (pid %d) exited with %s; starting it again (captured calls "
                "waited in the journal meanwhile)",
                process.pid,
                code,
            )
            delay = min(delay * 2, _MAX_DELAY_S)
            await self._spawn()

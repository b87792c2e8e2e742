"""Dataset build workers: what a `dataset.build_requested` delivery runs, restartably.

`DatasetWorker.handle` claims the dataset's row, runs the build in a child process
(dataset_build.run_isolated), keeps the claim and the JetStream message alive while it works,
records and publishes progress, and ends the row `built` (only once the snapshot's commit
marker is written) or `failed`.

A worker killed mid-build leaves its row `building` with a heartbeat that stops; JetStream
redelivers the unacked event after `ack_wait`, the next worker finds the heartbeat stale, takes
the build over and starts it afresh. The snapshot's version is the hash of its content, so the
restarted build writes the same version, and a half-written one has no commit marker.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Engine

from services.ingest.config import IngestSettings
from services.ingest.datasets import rows as dataset_rows
from services.ingest.datasets.build import BuildFailed, BuildJob, OnStep, StepProgress, run_isolated
from services.ingest.datasets.rows import Built
from services.ingest.datasets.spec import DatasetSpec
from shared.events import (
    DatasetBuildFailed,
    DatasetBuildProgressed,
    DatasetBuildRequested,
    DatasetBuilt,
    Event,
)
from shared.settings import S3Settings
from shared.storage import ObjectStore

log = logging.getLogger("tuneloop.ingest.datasets")

Publish = Callable[[Event], Coroutine[Any, Any, None]]
KeepAlive = Callable[[], Awaitable[None]]


class LostClaim(Exception):
    """Another worker took the build over (this one was thought dead); stop quietly."""


# --- the worker -------------------------------------------------------------------------------


def new_worker_id() -> str:
    return f"{socket.gethostname()[:32]}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


@dataclass
class DatasetWorker:
    """Runs the builds this process is handed, one at a time, in a worker thread."""

    engine: Engine
    store: ObjectStore
    s3: S3Settings
    publish: Publish
    settings: IngestSettings
    worker_id: str = ""

    def __post_init__(self) -> None:
        self.worker_id = self.worker_id or new_worker_id()

    @property
    def ack_wait_s(self) -> float:
        return self.settings.dataset_ack_wait_s

    @property
    def heartbeat_s(self) -> float:
        return self.ack_wait_s / 4

    @property
    def stale_after_s(self) -> float:
        # Longer than two missed heartbeats, shorter than ack_wait: by the time JetStream
        # redelivers a dead worker's event, its claim has gone stale.
        return self.ack_wait_s / 2

    async def handle(
        self, event: DatasetBuildRequested, *, keepalive: KeepAlive, last_delivery: bool
    ) -> float | None:
        """Process one delivery. Returns None to ack, or seconds after which to redeliver."""
        claim = await asyncio.to_thread(
            dataset_rows.claim,
            self.engine,
            event.dataset_id,
            tenant=event.tenant,
            worker=self.worker_id,
            stale_after_s=self.stale_after_s,
        )
        if claim.outcome == "missing":
            log.warning("dataset %s requested but not in this database; dropped", event.dataset_id)
            return None
        if claim.outcome == "done":
            return None  # a redelivery of a finished build changes nothing
        if claim.outcome == "busy":
            return self.stale_after_s  # another worker holds it; look again once it could be dead
        assert claim.row is not None
        spec = DatasetSpec.model_validate_json(claim.row.spec)
        return await self._run(event, spec, keepalive=keepalive, last_delivery=last_delivery)

    async def _run(
        self,
        event: DatasetBuildRequested,
        spec: DatasetSpec,
        *,
        keepalive: KeepAlive,
        last_delivery: bool,
    ) -> float | None:
        lost = threading.Event()
        beating = asyncio.create_task(self._keep_alive(event.dataset_id, keepalive, lost))
        on_step = self._on_step(event, asyncio.get_running_loop(), lost)
        try:
            job = BuildJob.of(
                self.engine,
                self.s3,
                tenant=event.tenant,
                spec=spec,
                file_wait_s=self.settings.dataset_file_wait_s,
            )
            children: list[subprocess.Popen[bytes]] = []
            try:
                built = await asyncio.to_thread(
                    run_isolated, job, on_step, on_start=children.append
                )
            except asyncio.CancelledError:
                # Shutting down: the thread cannot be cancelled, but killing the child ends it
                # (and lets the process exit). The event is redelivered; hand the build back.
                for child in children:
                    child.kill()
                dataset_rows.release(self.engine, event.dataset_id, worker=self.worker_id)
                raise
        except LostClaim:
            log.warning("dataset %s was taken over by another worker", event.dataset_id)
            return None
        except BuildFailed as exc:
            await self._fail(event, str(exc))
            return None
        except Exception as exc:
            return await self._transient(event, exc, last_delivery=last_delivery)
        finally:
            beating.cancel()
        await self._succeed(event, built)
        return None

    async def _keep_alive(
        self, dataset_id: str, keepalive: KeepAlive, lost: threading.Event
    ) -> None:
        """Tell JetStream the message is still being worked on, and the table the claim is."""
        while True:
            await asyncio.sleep(self.heartbeat_s)
            try:
                await keepalive()
                mine = await asyncio.to_thread(
                    dataset_rows.heartbeat, self.engine, dataset_id, worker=self.worker_id
                )
            except Exception:
                log.warning("dataset %s: heartbeat failed", dataset_id, exc_info=True)
                continue
            if not mine:
                lost.set()
                return

    def _on_step(
        self, event: DatasetBuildRequested, loop: asyncio.AbstractEventLoop, lost: threading.Event
    ) -> OnStep:
        """Called in the build thread after each step: row, event, and the test pause."""
        steps: list[dict[str, Any]] = []
        started = time.monotonic()

        def on_step(progress: StepProgress) -> None:
            if lost.is_set():
                raise LostClaim(event.dataset_id)
            # Seconds into this attempt when the step ended: where a slow build spends its time.
            elapsed = round(time.monotonic() - started, 3)
            steps.append(progress.to_dict() | {"elapsed_s": elapsed})
            state = {"step": progress.step, "steps": list(steps)}
            if not dataset_rows.record_progress(
                self.engine, event.dataset_id, worker=self.worker_id, progress=state
            ):
                raise LostClaim(event.dataset_id)
            message = DatasetBuildProgressed(
                tenant=event.tenant,
                dataset_id=event.dataset_id,
                step=progress.step,
                samples_in=progress.samples_in,
                samples_out=progress.samples_out,
            )
            future = asyncio.run_coroutine_threadsafe(self.publish(message), loop)
            try:
                future.result(timeout=10)
            except Exception:  # progress is informative; the build goes on without it
                log.warning("dataset %s: progress event not published", event.dataset_id)

        return on_step

    async def _succeed(self, event: DatasetBuildRequested, built: Built) -> None:
        mine = await asyncio.to_thread(
            dataset_rows.finish_built,
            self.engine,
            event.dataset_id,
            worker=self.worker_id,
            built=built,
        )
        if not mine:
            return  # taken over: the other worker writes the same version and says so
        await self.publish(
            DatasetBuilt(
                # Deterministic: a re-published fact is dropped by the duplicate window.
                event_id=f"{event.dataset_id}-built",
                tenant=event.tenant,
                dataset_id=event.dataset_id,
                dataset_version=built.version,
                uri=built.uri,
                train_count=built.train_count,
                eval_count=built.eval_count,
            )
        )

    async def _fail(self, event: DatasetBuildRequested, reason: str) -> None:
        log.info("dataset %s failed: %s", event.dataset_id, reason)
        mine = await asyncio.to_thread(
            dataset_rows.finish_failed,
            self.engine,
            event.dataset_id,
            worker=self.worker_id,
            error=reason,
        )
        if mine:
            await self.publish(
                DatasetBuildFailed(
                    event_id=f"{event.dataset_id}-failed",
                    tenant=event.tenant,
                    dataset_id=event.dataset_id,
                    reason=reason,
                )
            )

    async def _transient(
        self, event: DatasetBuildRequested, exc: Exception, *, last_delivery: bool
    ) -> float | None:
        """Storage away, inputs not there yet, a bug: retry later, or give up on the last try."""
        if last_delivery:
            log.error("dataset %s: giving up", event.dataset_id, exc_info=exc)
            await self._fail(event, f"build failed after retries: {type(exc).__name__}: {exc}")
            return None
        log.warning("dataset %s: build interrupted, will retry: %s", event.dataset_id, exc)
        await asyncio.to_thread(
            dataset_rows.release, self.engine, event.dataset_id, worker=self.worker_id
        )
        return self.settings.dataset_retry_delay_s

"""Spill episodes: the time from a first sample kept in the spill file (NATS or S3 away) to the
file being empty again. The ingest service watches its data directory's spill file, which its
shipper and it both write, every second:

- on its /metrics, what waits there and the cap, and the episodes begun, for Prometheus
  (deploy/prometheus/alerts.yml: TuneloopCaptureSpilling while they last);
- once the file has stayed empty for a few seconds and the bus is reachable, one
  `capture.spilled` per tenant the ledger names (spill_contents.py), for tenants' notification rules
  and integrators. The bus is what is away during most episodes, so the fact follows them.

    tuneloop_capture_spill_bytes             bytes waiting in the spill file (its claims too)
    tuneloop_capture_spill_records           samples waiting there
    tuneloop_capture_spill_limit_bytes       its cap (TUNELOOP_INGEST_SPILL_MAX_BYTES)
    tuneloop_capture_spill_episodes_total    episodes begun, seen by this process
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import datetime

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

from services.ingest.capture.spill import SpillFile
from services.ingest.capture.spill_contents import Backlog, BacklogCounter, Tally
from shared.db import utcnow
from shared.events import CaptureSpilled, Event
from shared.tenancy import is_tenant_id

log = logging.getLogger("tuneloop.ingest.capture")
Publish = Callable[[Event], Awaitable[None]]

_meter = metrics.get_meter("tuneloop.ingest.capture")
EPISODES = _meter.create_counter(
    "tuneloop.capture.spill.episodes",
    description="Episodes of captured samples kept in the spill file (NATS or S3 away), begun.",
)
_seen: dict[str, float] = {"bytes": 0.0, "records": 0.0, "limit_bytes": 0.0}


def _observe(name: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
    def observe(options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(_seen[name])]

    return observe


for _name, _words in (
    ("bytes", "Bytes of captured samples waiting in the spill file for NATS or S3."),
    ("records", "Captured samples waiting in the spill file for NATS or S3."),
    ("limit_bytes", "The spill file's cap; past it new samples are refused."),
):
    _meter.create_observable_gauge(
        f"tuneloop.capture.spill.{_name}", callbacks=[_observe(_name)], description=_words
    )


def prime() -> None:
    """The episode counter's series at 0, once the process's meter provider is set, so
    Prometheus' increase() sees the first episode too."""
    EPISODES.add(0)


@dataclass
class Episode:
    seen_at: datetime  # when this process first saw the spill file hold something
    max_bytes: int = 0
    empty_since: datetime | None = None


class SpillWatch:
    def __init__(
        self,
        spill: SpillFile,
        *,
        publish: Publish,
        can_publish: Callable[[], bool],
        interval_s: float = 1.0,
        quiet_s: float = 3.0,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.spill = spill
        self._publish, self._can_publish = publish, can_publish
        # quiet_s: the empty file's wait, past the writers' ledger flushes (every second).
        self.interval_s, self.quiet_s, self.clock = interval_s, quiet_s, clock
        self._counter = BacklogCounter(spill.files)
        self.episode: Episode | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        prime()
        _seen["limit_bytes"] = float(self.spill.max_bytes)
        self._task = asyncio.create_task(self._watching(), name="spill-watch")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _watching(self) -> None:
        while True:
            try:
                await self.tick()
            except Exception:  # said, and looked at again next second
                log.exception("watching the spill file failed")
            await asyncio.sleep(self.interval_s)

    async def tick(self) -> None:
        backlog = await asyncio.to_thread(self._counter.count)
        _seen["bytes"], _seen["records"] = float(backlog.bytes), float(backlog.records)
        ledger = self.spill.ledger
        now = self.clock()
        if self.episode is None and (backlog.bytes or (ledger is not None and ledger.has_lines())):
            self.episode = Episode(seen_at=now)
            EPISODES.add(1)
            log.warning("capture is keeping samples in %s until NATS and S3 take them",
                        self.spill.path.name)  # fmt: skip
        if self.episode is not None:
            await self._follow(self.episode, backlog, now)

    async def _follow(self, episode: Episode, backlog: Backlog, now: datetime) -> None:
        episode.max_bytes = max(episode.max_bytes, backlog.bytes)
        if backlog.bytes:
            episode.empty_since = None
            return
        episode.empty_since = episode.empty_since or now
        if (now - episode.empty_since).total_seconds() < self.quiet_s or not self._can_publish():
            return
        tallies = await asyncio.to_thread(self._claim)
        for event in self.facts(episode, tallies):
            await self._publish(event)  # raises: the claim stays, published again next tick
        if self.spill.ledger is not None:
            await asyncio.to_thread(self.spill.ledger.release)
        self.episode = None
        log.info("capture's spill file is empty again; %d tenants told", len(tallies))

    def _claim(self) -> dict[str, Tally]:
        return self.spill.ledger.claim() if self.spill.ledger is not None else {}

    def facts(self, episode: Episode, tallies: dict[str, Tally]) -> list[CaptureSpilled]:
        """One `capture.spilled` per tenant; its id is the same however often it is made, so
        the stream drops a second publish of it."""
        ended = episode.empty_since or self.clock()
        firsts = [t.first for t in tallies.values() if t.first is not None]
        started = min([episode.seen_at, *firsts])
        fraction = min(episode.max_bytes / self.spill.max_bytes, 1.0)
        return [
            CaptureSpilled(
                tenant=tenant,
                event_id=f"capture-spilled-{tenant}-{int(started.timestamp() * 1000)}",
                started_at=started,
                ended_at=max(ended, started),
                samples=tally.samples,
                bytes=tally.bytes,
                refused=tally.refused,
                max_backlog_fraction=round(fraction, 6),
            )
            for tenant, tally in sorted(tallies.items())
            if is_tenant_id(tenant)  # from samples, which were checked: never otherwise
        ]

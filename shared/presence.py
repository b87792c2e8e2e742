"""Presence: each service instance announces itself on the bus and keeps a view of its peers.

Heartbeats travel on core NATS (no stream): presence is only worth knowing now. A service's
`/healthz` shows the peers it hears, so "can service A's events reach service B" is visible in
`tuneloop status` and checked by the integration tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from faststream.nats import NatsBroker

from shared.bus import publish
from shared.events import ServiceHeartbeat

log = logging.getLogger("tuneloop.presence")


@dataclass
class Peer:
    service: str
    instance_id: str
    address: str
    last_seen: float  # monotonic


class Presence:
    """Heartbeats out, peers in."""

    def __init__(
        self,
        *,
        service: str,
        instance_id: str,
        address: str,
        interval_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.service = service
        self._clock = clock
        self.instance_id = instance_id
        self.address = address
        self.interval_s = interval_s
        self.started_at = datetime.now(UTC)
        self._peers: dict[str, Peer] = {}
        self._task: asyncio.Task[None] | None = None

    def heartbeat(self) -> ServiceHeartbeat:
        return ServiceHeartbeat(
            service=self.service,
            instance_id=self.instance_id,
            address=self.address,
            started_at=self.started_at,
        )

    async def record(self, beat: ServiceHeartbeat) -> None:
        """Subscriber body: remember who spoke last and when."""
        if beat.instance_id == self.instance_id:
            return
        self._peers[beat.instance_id] = Peer(
            beat.service, beat.instance_id, beat.address, self._clock()
        )

    def peers(self) -> list[dict[str, object]]:
        """Peers heard within three heartbeat intervals, freshest first."""
        now = self._clock()
        horizon = now - 3 * self.interval_s
        alive = [peer for peer in self._peers.values() if peer.last_seen >= horizon]
        alive.sort(key=lambda peer: -peer.last_seen)
        return [
            {
                "service": peer.service,
                "instance_id": peer.instance_id,
                "address": peer.address,
                "seen_s_ago": round(now - peer.last_seen, 2),
            }
            for peer in alive
        ]

    async def _beat_forever(self, broker: NatsBroker) -> None:
        while True:
            # While NATS is away the client buffers or refuses; presence must never crash the service.
            try:
                await publish(broker, self.heartbeat())
            except Exception as exc:
                log.debug("heartbeat not sent: %s", exc)
            await asyncio.sleep(self.interval_s)

    def start(self, broker: NatsBroker) -> None:
        self._task = asyncio.create_task(
            self._beat_forever(broker), name=f"{self.service}-heartbeat"
        )

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

"""Served names at the gateway: a tenant's stable model name answered by a primary deployment
and, while a change is tried, a canary taking a share of the calls or a shadow mirrored a share
(its answers kept as samples paired with the primary's, never returned) (the hoster decides which;
`deployment.served_name_changed` says so, services/hoster/served_names.py).

The split is by a hash of the caller's `X-Request-Id` when it sends one, else of its tenant and
body, so a retried call lands on the version that answered it first. The gateway watches the
canary's calls it makes: over the last `min_requests` of them, an error rate (5xx, upstream
unreachable) above the policy's or a p95 latency above it stops the canary's share here at once
and is reported (`deployment.canary_failed`) for the hoster to roll back everywhere.
"""

from __future__ import annotations

import hashlib
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from shared.events import CanaryFailed, ServedNameChanged, ServedTarget

BUCKETS = 10_000  # the split's resolution: 0.01 %


def bucket(key: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") % BUCKETS


@dataclass
class Served:
    """One served name's state here: where its calls go and the canary's last calls."""

    tenant: str
    event: ServedNameChanged
    window: deque[tuple[bool, float]] = field(init=False)
    tripped: bool = False

    def __post_init__(self) -> None:
        self.window = deque(maxlen=self.event.rollback.min_requests)

    @property
    def revision(self) -> int:
        return self.event.revision

    def pick(self, split_key: Callable[[], bytes]) -> tuple[ServedTarget, bool] | None:
        """The deployment this call goes to, and whether it is the canary."""
        event = self.event
        sharing = event.canary is not None and event.canary_percent > 0 and not self.tripped
        if sharing and (event.primary is None or bucket(split_key()) < event.canary_percent * 100):
            assert event.canary is not None
            return event.canary, True
        return (event.primary, False) if event.primary is not None else None

    def shadow(self, split_key: Callable[[], bytes]) -> ServedTarget | None:
        """Where to mirror this call (one the primary answers), or None. Its own hash, so the
        mirrored share is not the canary's share over again."""
        event = self.event
        if event.shadow is None or event.shadow_percent <= 0:
            return None
        if bucket(b"shadow\0" + split_key()) < event.shadow_percent * 100:
            return event.shadow
        return None

    def observe(self, ok: bool, latency_ms: float) -> CanaryFailed | None:
        """One call the canary answered (or failed); the verdict once, when it crosses."""
        if self.tripped:
            return None
        self.window.append((ok, latency_ms))
        policy = self.event.rollback
        if len(self.window) < policy.min_requests:
            return None
        errors = sum(1 for good, _ in self.window if not good)
        p95 = _p95([latency for _, latency in self.window])
        reasons = []
        if errors / len(self.window) > policy.max_error_rate:
            reasons.append(
                f"error rate {errors / len(self.window):.1%} > {policy.max_error_rate:.1%}"
            )
        if policy.max_p95_ms is not None and p95 > policy.max_p95_ms:
            reasons.append(f"p95 latency {p95:.0f} ms > {policy.max_p95_ms:.0f} ms")
        if not reasons:
            return None
        self.tripped = True
        assert self.event.canary is not None
        return CanaryFailed(
            tenant=self.tenant,
            name=self.event.name,
            revision=self.revision,
            deployment_id=self.event.canary.deployment_id,
            requests=len(self.window),
            errors=errors,
            p95_ms=p95,
            reason="; ".join(reasons),
        )


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]

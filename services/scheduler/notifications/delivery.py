"""Sending the outbox: signed POSTs, bounded in number and time, retried with exponential
backoff until delivered or given up.

    2xx                                delivered
    408, 429, 5xx, no answer           retried: backoff_s x 2^(attempt-1) (+-10 %), at most
                                       max_backoff_s, or the answer's Retry-After (same bound);
                                       failed once max_attempts are made
    any other status (3xx included:    failed at once: the receiver said no, and a redirect
    redirects are not followed)        could lead anywhere
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from email.utils import parsedate_to_datetime
from urllib.parse import urlsplit

import httpx
from sqlalchemy.engine import Engine

from services.scheduler.config import NotificationSettings
from services.scheduler.models import NotificationDeliveryRow, NotificationRuleRow
from services.scheduler.notifications import metrics, outbox, signing
from services.scheduler.notifications.outbox import Outcome, Tried
from shared.db import session_scope, utcnow

log = logging.getLogger("tuneloop.scheduler.notifications")
RETRIED_STATUSES = frozenset({408, 429})
USER_AGENT = "tuneloop-notifications/1"
# Past the request's timeout, before a claimed delivery is free for another try.
CLAIM_MARGIN_S = 30.0


@dataclass(frozen=True)
class Answer:
    status_code: int | None
    error: str | None
    retry_after_s: float | None
    duration_ms: float


def outcome(answer: Answer, *, attempt: int, max_attempts: int) -> Outcome:
    code = answer.status_code
    if code is not None and 200 <= code < 300:
        return "delivered"
    retriable = code is None or code in RETRIED_STATUSES or code >= 500
    return "retry" if retriable and attempt < max_attempts else "failed"


def backoff_s(
    answer: Answer, *, attempt: int, settings: NotificationSettings, jitter: float = 0.0
) -> float:
    """Seconds before the next try; `jitter` in [-1, 1] spreads retries by up to 10 %."""
    if answer.retry_after_s is not None:
        return min(max(answer.retry_after_s, 0.0), settings.max_backoff_s)
    delay = settings.backoff_s * 2.0 ** (attempt - 1) * (1 + 0.1 * jitter)
    return min(delay, settings.max_backoff_s)


def retry_after(value: str | None, now: datetime) -> float | None:
    """Retry-After's seconds or HTTP date, as seconds from now; None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return None if when.tzinfo is None else max((when - now).total_seconds(), 0.0)


def where(url: str) -> str:
    """A URL as logs may show it: scheme and host (a Slack webhook's path is its secret)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}"


async def post(
    client: httpx.AsyncClient, url: str, body: bytes, headers: dict[str, str], timeout_s: float
) -> Answer:
    """One signed POST, `timeout_s` in all (a receiver dripping its answer holds no slot
    longer); the answer's body is never read, only its status and Retry-After."""
    started = time.perf_counter()
    try:
        async with asyncio.timeout(timeout_s):
            request = client.build_request("POST", url, content=body, headers=headers)
            response = await client.send(request, stream=True)
            await response.aclose()
    except (httpx.HTTPError, TimeoutError) as exc:
        took = (time.perf_counter() - started) * 1000
        reason = f"{type(exc).__name__}: {exc}".replace(url, where(url))
        return Answer(None, reason.rstrip(": ")[:500], None, took)
    took = (time.perf_counter() - started) * 1000
    error = None if response.is_success else f"HTTP {response.status_code}"
    wait = retry_after(response.headers.get("retry-after"), utcnow())
    return Answer(response.status_code, error, wait, took)


class Dispatcher:
    """Claims due deliveries and sends them, `concurrency` at a time."""

    def __init__(
        self,
        engine: Engine,
        settings: NotificationSettings,
        server_secret: str,
        *,
        client: httpx.AsyncClient | None = None,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.engine, self.settings, self.clock = engine, settings, clock
        self._secret = server_secret
        self.client = client or httpx.AsyncClient(
            timeout=settings.timeout_s,
            follow_redirects=False,
            headers={"user-agent": USER_AGENT, "content-type": "application/json"},
        )
        self._slots = asyncio.Semaphore(settings.concurrency)

    async def send_due(self) -> int:
        """One round: every delivery due now (up to a batch), sent; how many were tried."""
        claimed = await asyncio.to_thread(self._claim)
        await asyncio.gather(*(self._send(delivery, key) for delivery, key in claimed))
        return len(claimed)

    def _claim(self) -> list[tuple[NotificationDeliveryRow, bytes]]:
        now = self.clock()
        until = outbox.later(now, self.settings.timeout_s + CLAIM_MARGIN_S)
        claimed = []
        with session_scope(self.engine) as session:
            # No more than the slots: each claimed one is sent before its claim runs out.
            for delivery in outbox.due(session, now=now, limit=self.settings.concurrency):
                rule = session.get(NotificationRuleRow, delivery.rule_id)
                if rule is not None and outbox.claim(session, delivery, until=until):
                    key = signing.rule_key(self._secret, rule.id, rule.secret_version)
                    claimed.append((delivery, key))
        return claimed

    async def _send(self, delivery: NotificationDeliveryRow, key: bytes) -> None:
        async with self._slots:
            started = self.clock()
            headers = signing.headers(key, delivery.id, delivery.body)
            answer = await post(
                self.client, delivery.url, delivery.body, headers, self.settings.timeout_s
            )
        attempt = delivery.attempts + 1
        result = outcome(answer, attempt=attempt, max_attempts=self.settings.max_attempts)
        wait = backoff_s(
            answer,
            attempt=attempt,
            settings=self.settings,
            jitter=random.uniform(-1, 1),  # noqa: S311
        )
        tried = Tried(
            started_at=started,
            duration_ms=answer.duration_ms,
            status_code=answer.status_code,
            error=answer.error,
            outcome=result,
            next_attempt_at=outbox.later(self.clock(), wait) if result == "retry" else None,
        )
        await asyncio.to_thread(self._record, delivery.id, tried)
        metrics.DELIVERIES.add(1, {"outcome": result})
        if result != "delivered":
            log.warning(
                "notification %s (rule %s) to %s: attempt %d %s (%s)",
                delivery.id, delivery.rule_id, where(delivery.url), attempt,
                "failed, retrying" if result == "retry" else "failed for good", answer.error,
            )  # fmt: skip

    def _record(self, delivery_id: str, tried: Tried) -> None:
        with session_scope(self.engine) as session:
            outbox.record(session, delivery_id, tried)

    async def aclose(self) -> None:
        await self.client.aclose()

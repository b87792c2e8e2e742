"""The trainer's reports over HMAC-signed webhooks, sent so that the endpoint can never hurt training.

`send()` only queues (never blocks, never raises). A background thread POSTs the queue in order,
signing every attempt afresh (timestamp + nonce, `shared.signing.sign`), retrying connection
errors, timeouts, 408, 429 and 5xx with exponential backoff for as long as the process lives, and
dropping a report the receiver refuses with another 4xx (logged). While the endpoint is down the
queue holds up to `max_buffered` reports; beyond that the oldest progress reports go, never a
started / checkpoint_saved / completed / failed one. `close()` flushes with a bounded wait.
The receiver deduplicates by `report_id`: a request that timed out may have arrived anyway.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import httpx
from tenacity import RetryCallState, Retrying, retry_if_exception_type, wait_exponential_jitter

from services.trainer.config import JobConfig, WebhookSettings
from shared.reports import (
    CheckpointSavedReport,
    CompletedReport,
    FailedReport,
    ProgressReport,
    StartedReport,
    TrainerReport,
)
from shared.signing import sign

log = logging.getLogger(__name__)

_RETRYABLE_STATUSES = frozenset({408, 429})
_USER_AGENT = "tuneloop-trainer"
_DROP_LOG_EVERY = 100  # a full buffer drops one report per step: log the first, then every 100th


class Reporter(Protocol):
    def send(self, report: TrainerReport) -> None: ...

    def close(self, timeout_s: float = 10.0) -> bool:
        """Flush within timeout_s; True when every report sent was delivered."""
        ...


@dataclass(frozen=True)
class ReporterStats:
    sent: int
    delivered: int
    dropped: int  # by a full buffer, or sent after close
    rejected: int  # refused by the receiver with a 4xx
    failed_attempts: int  # requests that failed and were retried (or abandoned at close)
    pending: int


@dataclass(frozen=True)
class _Pending:
    report_id: str
    kind: str
    seq: int
    body: bytes


class _Transient(Exception):
    """The request may succeed later: connection error, timeout, 408, 429 or 5xx."""


class _Rejected(Exception):
    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"HTTP {status}: {detail}")
        self.status = status


def _safe_url(url: str) -> str:
    """The URL without query or credentials, for logs (a token may hide in either)."""
    parsed = httpx.URL(url)
    port = f":{parsed.port}" if parsed.port else ""
    return f"{parsed.scheme}://{parsed.host}{port}{parsed.path}"


class WebhookReporter:
    """Delivers reports in order from a background thread; see the module docstring."""

    def __init__(
        self,
        settings: WebhookSettings,
        *,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 30.0,
    ) -> None:
        self._url, self._where = settings.url, _safe_url(settings.url)
        self._secret = settings.secret  # a SecretStr: revealed only to sign
        self._timeout_s = settings.timeout_s
        self._max_buffered = settings.max_buffered
        self._wait = wait_exponential_jitter(initial=backoff_initial_s, max=backoff_max_s)
        self._client = httpx.Client(headers={"User-Agent": _USER_AGENT})
        self._cond = threading.Condition()
        self._wake = threading.Event()  # set by close(): cut a backoff sleep short
        self._queue: deque[_Pending] = deque()
        self._inflight: _Pending | None = None
        self._closing, self._deadline = False, float("inf")
        self._sent = self._delivered = self._dropped = self._rejected = self._failed = 0
        self._down_since: float | None = None
        self._thread = threading.Thread(target=self._run, name="webhook-reporter", daemon=True)
        self._thread.start()

    # -- the training loop's side ----------------------------------------------------------------
    def send(self, report: TrainerReport) -> None:
        """Queue a report; returns at once and never raises."""
        try:
            item = _Pending(
                report.report_id, report.kind, report.seq, report.model_dump_json().encode()
            )
        except Exception:
            log.exception("webhook report not sent: it cannot be serialised")
            return
        with self._cond:
            if self._closing:
                self._dropped += 1
                log.warning(
                    "webhook %s report seq=%d sent after close: dropped", item.kind, item.seq
                )
                return
            self._queue.append(item)
            self._sent += 1
            self._enforce_bound()
            self._cond.notify_all()

    def _enforce_bound(self) -> None:
        """Called with the lock held: drop the oldest queued progress reports beyond the bound."""
        while len(self._queue) + (self._inflight is not None) > self._max_buffered:
            index = next((i for i, item in enumerate(self._queue) if item.kind == "progress"), None)
            if index is None:
                return  # only reports that must not be lost: the bound gives way
            dropped = self._queue[index]
            del self._queue[index]
            self._dropped += 1
            if self._dropped % _DROP_LOG_EVERY == 1:
                log.warning(
                    "webhook %s unreachable and %d reports buffered: dropping the oldest progress "
                    "reports (seq=%d; %d dropped so far)",
                    self._where,
                    self._max_buffered,
                    dropped.seq,
                    self._dropped,
                )

    def close(self, timeout_s: float = 10.0) -> bool:
        """Deliver what is queued within timeout_s; True when every report sent was delivered."""
        with self._cond:
            if not self._closing:
                self._closing, self._deadline = True, time.monotonic() + timeout_s
            self._cond.notify_all()
        self._wake.set()
        self._thread.join(max(0.0, self._deadline - time.monotonic()))
        stats = self.stats()
        if stats.pending:
            log.warning(
                "webhook %s: %d reports undelivered at exit (%d delivered)",
                self._where,
                stats.pending,
                stats.delivered,
            )
        if not self._thread.is_alive():
            self._client.close()
        return stats.pending == 0 and stats.delivered == stats.sent

    def stats(self) -> ReporterStats:
        with self._cond:
            return ReporterStats(
                sent=self._sent,
                delivered=self._delivered,
                dropped=self._dropped,
                rejected=self._rejected,
                failed_attempts=self._failed,
                pending=len(self._queue) + (self._inflight is not None),
            )

    # -- the sending thread ----------------------------------------------------------------------
    def _run(self) -> None:
        while (item := self._next()) is not None:
            outcome = self._deliver(item)
            with self._cond:
                self._inflight = None
                if outcome == "abandoned":
                    self._queue.appendleft(item)  # still pending; close() reports it
                    return
                self._delivered += outcome == "delivered"
                self._rejected += outcome == "rejected"

    def _next(self) -> _Pending | None:
        with self._cond:
            while not self._queue and not self._closing:
                self._cond.wait()
            if not self._queue or time.monotonic() >= self._deadline:
                return None
            self._inflight = self._queue.popleft()
            return self._inflight

    def _deliver(self, item: _Pending) -> Literal["delivered", "rejected", "abandoned"]:
        retrying = Retrying(
            retry=retry_if_exception_type(_Transient),
            wait=self._wait,
            stop=self._past_deadline,
            sleep=self._sleep,
            before_sleep=self._note_failure,
            reraise=True,
        )
        try:
            retrying(self._post, item)
        except _Rejected as exc:
            log.error(
                "webhook %s refused %s report seq=%d (id %s): %s; the report is dropped",
                self._where,
                item.kind,
                item.seq,
                item.report_id,
                exc,
            )
            return "rejected"
        except _Transient:
            with self._cond:
                self._failed += 1
            return "abandoned"  # only when close()'s deadline has passed
        except Exception:
            # A bug here must cost one report, not the thread: later reports still go out.
            log.exception(
                "webhook %s report seq=%d could not be sent; dropped", item.kind, item.seq
            )
            return "rejected"
        if self._down_since is not None:
            log.info(
                "webhook %s reachable again after %.0fs",
                self._where,
                time.monotonic() - self._down_since,
            )
            self._down_since = None
        return "delivered"

    def _post(self, item: _Pending) -> None:
        # A fresh timestamp and nonce per attempt: a resent body must not look like a replay.
        headers = sign(item.body, self._secret.get_secret_value())
        headers["Content-Type"] = "application/json"
        timeout = max(0.1, min(self._timeout_s, self._deadline - time.monotonic()))
        try:
            response = self._client.post(
                self._url, content=item.body, headers=headers, timeout=timeout
            )
        except httpx.RequestError as exc:  # connection refused, DNS, timeouts, broken responses
            raise _Transient(type(exc).__name__) from None
        status = response.status_code
        if 200 <= status < 300:
            return
        if status in _RETRYABLE_STATUSES or status >= 500:
            raise _Transient(f"HTTP {status}")
        raise _Rejected(status, response.text[:200])

    def _past_deadline(self, _state: RetryCallState) -> bool:
        return time.monotonic() >= self._deadline

    def _sleep(self, seconds: float) -> None:
        self._wake.wait(max(0.0, min(seconds, self._deadline - time.monotonic())))

    def _note_failure(self, state: RetryCallState) -> None:
        with self._cond:
            self._failed += 1
        exc = state.outcome.exception() if state.outcome else None
        if self._down_since is None:
            self._down_since = time.monotonic()
            log.warning(
                "webhook %s unreachable (%s); reports are buffered and retried", self._where, exc
            )
        else:
            log.debug("webhook %s attempt %d failed: %s", self._where, state.attempt_number, exc)


class NullReporter:
    """No webhook configured: reports go to the log only."""

    def send(self, report: TrainerReport) -> None:
        try:
            log.info("report %s", report.model_dump_json())
        except Exception:
            log.exception("report could not be logged")

    def close(self, timeout_s: float = 10.0) -> bool:
        return True


def make_reporter(config: JobConfig) -> Reporter:
    return WebhookReporter(config.webhook) if config.webhook is not None else NullReporter()


class ReportStamper:
    """Builds the reports of one attempt: fills job, attempt, tenant and the next `seq`."""

    def __init__(self, *, job_id: str, attempt_id: str, tenant: str) -> None:
        self._common = {"job_id": job_id, "attempt_id": attempt_id, "tenant": tenant}
        self._seq = itertools.count()
        self._lock = threading.Lock()

    @classmethod
    def for_job(cls, config: JobConfig) -> ReportStamper:
        return cls(job_id=config.job_id, attempt_id=config.attempt_id, tenant=config.tenant)

    def _stamp(self) -> dict[str, Any]:
        with self._lock:
            return {**self._common, "seq": next(self._seq)}

    def started(self, **fields: Any) -> StartedReport:
        return StartedReport(**self._stamp(), **fields)

    def progress(self, **fields: Any) -> ProgressReport:
        return ProgressReport(**self._stamp(), **fields)

    def checkpoint_saved(self, **fields: Any) -> CheckpointSavedReport:
        return CheckpointSavedReport(**self._stamp(), **fields)

    def completed(self, **fields: Any) -> CompletedReport:
        return CompletedReport(**self._stamp(), **fields)

    def failed(self, **fields: Any) -> FailedReport:
        return FailedReport(**self._stamp(), **fields)

"""Settings of the scheduler service (env prefix TUNELOOP_SCHEDULER_).

Hyperparameters are not here: the recipe decides them per job. These are the machine's facts
(which device class the local provider trains on, how many threads a trainer gets) and the
service's own secrets.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from services.scheduler.throughput import DeviceClass
from shared.settings import AppSettings, ServiceUrl, Settings, refuse_weak_secrets


class SchedulerSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="TUNELOOP_SCHEDULER_", env_file=".env", env_file_encoding="utf-8", extra="ignore"
    )

    # Attempts' work directories (config, log, exit status); default: <data dir>/jobs.
    work_dir: Path | None = None
    # Each job's webhook secret is derived from this one (HMAC of the job id), so no secret is
    # stored per job or travels on the bus. Production refuses a placeholder or a short one.
    webhook_secret: SecretStr = SecretStr("tuneloop-dev-webhook")
    # The device class the local provider trains on: the recipe's throughput row.
    local_device: DeviceClass = "cpu"
    # Threads a local trainer may use: every core. The eval engine (one thread) is busy for
    # ~15 s an eval point and idle otherwise, so the trainer shares the cores with it then
    # rather than leaving one idle the rest of the run (KNOWLEDGE.md: 2.4 s a step with both
    # threads, 3.4 s with one).
    trainer_threads: int = Field(default_factory=lambda: os.cpu_count() or 1, ge=1)
    # How long a cancelled trainer may take to checkpoint and exit before SIGKILL.
    cancel_grace_s: float = Field(default=30.0, gt=0)
    # How often running attempts are polled for an exit the trainer could not report.
    poll_interval_s: float = Field(default=2.0, gt=0)
    # The scheduler's base URL as trainers on other machines reach it (a Kubernetes or SkyPilot
    # rung's), for their reports; a rung's `report_url` wins. None: local trainers only.
    public_url: str | None = Field(default=None, pattern=r"^https?://[^\s/]+(/[^\s]*)?$")
    # The ingest service, for dataset builds of uploaded files and retrain policies' traffic
    # counts; default: the local stack's (bind host, ingest port).
    ingest_url: ServiceUrl | None = None
    # The GPU ladder (ladder.py); None: the local provider alone.
    providers_file: Path | None = None
    # Attempts a job may fail (a crash, a NaN, a lost trainer) before it fails; preemptions and
    # the scheduler's own stops (rollover, pause) do not count.
    max_failed_attempts: int = Field(default=3, ge=1)
    # How long before a provider's max runtime an attempt is rolled over to a new one (time for
    # the trainer to finish its step and write a checkpoint).
    rollover_lead_s: float = Field(default=60.0, ge=0)
    # A running attempt that has not reported for this long is taken for lost (a hung trainer,
    # a node gone quiet): stopped, and the job goes on in a new attempt.
    heartbeat_timeout_s: float = Field(default=900.0, gt=0)
    # Jobs of one tenant running at once; the rest wait queued (placement.py says in what order).
    tenant_max_running: int = Field(default=2, ge=1)
    # The most any tenant's training may cost a calendar month (UTC), in USD at the ladder's
    # prices; a tenant's admin may set a lower cap of its own (budgets.py). None: no cap.
    tenant_monthly_cap: float | None = Field(default=None, ge=0)
    # How often retrain policies are checked for new traffic (retrain.py).
    retrain_interval_s: float = Field(default=30.0, gt=0)
    # When `batch` jobs may start, UTC hours "start-end" (e.g. "22-6": overnight); None: any time.
    batch_window: str | None = Field(default=None, pattern=r"^([01]?\d|2[0-3])-([01]?\d|2[0-4])$")

    def in_batch_window(self, hour: int) -> bool:
        if self.batch_window is None:
            return True
        start, end = (int(part) for part in self.batch_window.split("-"))
        return start <= hour < end if start <= end else hour >= start or hour < end

    def ingest(self, settings: Settings) -> str:
        return self.ingest_url.rstrip("/") if self.ingest_url else settings.local_url("ingest")

    @classmethod
    def load(cls, app: AppSettings) -> SchedulerSettings:
        """The settings from the environment; in production the webhook secret must be a real
        one (shared.settings.refuse_weak_secrets), as the shared secrets must be."""
        own = cls()
        refuse_weak_secrets(app, {"TUNELOOP_SCHEDULER_WEBHOOK_SECRET": own.webhook_secret})
        return own


class NotificationSettings(BaseSettings):
    """How tenants' notification rules are delivered (env prefix TUNELOOP_SCHEDULER_NOTIFY_;
    notifications/). Retries wait `backoff_s`, doubling each time up to `max_backoff_s` (or
    what a 429/503's Retry-After asks, up to the same bound); after `max_attempts` a delivery
    is given up and recorded as failed. The defaults retry for about 3.4 hours."""

    model_config = SettingsConfigDict(
        env_prefix="TUNELOOP_SCHEDULER_NOTIFY_",
        env_file=".env",
        env_file_encoding="utf-8",
        extra="ignore",
    )

    # Deliveries of one alert before it is given up, the first retry's wait, and the longest.
    max_attempts: int = Field(default=12, ge=1, le=50)
    backoff_s: float = Field(default=10.0, gt=0)
    max_backoff_s: float = Field(default=3600.0, gt=0)
    # Per request (connect, send, answer): a receiver should answer at once and work later.
    timeout_s: float = Field(default=10.0, gt=0, le=120)
    # Requests in flight at once, over every rule and tenant.
    concurrency: int = Field(default=8, ge=1, le=256)
    # How often running jobs are checked for no progress and tenants' budgets for thresholds.
    check_interval_s: float = Field(default=30.0, gt=0)
    # How often the outbox is read when nothing woke it (a new alert wakes it at once).
    poll_interval_s: float = Field(default=1.0, gt=0)

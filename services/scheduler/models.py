"""Tables owned by the scheduler service: fine-tuning jobs, their events, checkpoints and attempts;
retrain policies; tenants' notification rules and their deliveries (notifications/).

Structured parts of a job (the request's hyperparameters, the recipe's decisions, the trainer
config, an error) are stored as JSON documents: they are read whole with the job and never
filtered on. A job's events and checkpoints page by (job, created_at, id).
"""

from datetime import datetime

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from shared.db import UTCDateTime, utcnow


class JobRow(SQLModel, table=True):
    __tablename__ = "scheduler_jobs"
    __table_args__ = (sa.Index("ix_scheduler_jobs_tenant_created", "tenant", "created_at", "id"),)

    id: str = Field(primary_key=True, max_length=64)
    tenant: str = Field(max_length=63)
    status: str = Field(max_length=24, index=True)
    model: str = Field(max_length=128)
    training_file: str = Field(max_length=128)
    validation_file: str | None = Field(default=None, max_length=128)
    dataset_id: str | None = Field(default=None, max_length=64)
    dataset_uri: str | None = Field(default=None, max_length=1024)
    suffix: str | None = Field(default=None, max_length=64)
    seed: int = 0
    auto_deploy: bool = False
    max_duration_s: float | None = None
    # The most the job's attempts may cost (USD at the ladder's prices); reached, it stops.
    max_cost: float | None = None
    # urgent | normal | batch: the order jobs are placed in (attempts.py).
    priority: str = Field(default="normal", max_length=8)
    fine_tuned_model: str | None = Field(default=None, max_length=256)
    trained_tokens: int | None = None
    base_score: float | None = None
    best_step: int | None = None
    gate: str | None = Field(default=None, max_length=16)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    started_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    finished_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    estimated_finish: datetime | None = Field(default=None, sa_type=UTCDateTime)
    # JSON documents: the request (hyperparameters, method, metadata), the recipe's plan and
    # decisions, and the error once failed.
    request: bytes = Field(sa_type=sa.LargeBinary)
    plan: bytes | None = Field(default=None, sa_type=sa.LargeBinary)
    error: bytes | None = Field(default=None, sa_type=sa.LargeBinary)


class JobEventRow(SQLModel, table=True):
    __tablename__ = "scheduler_job_events"
    __table_args__ = (
        sa.Index("ix_scheduler_job_events_job_created", "job_id", "created_at", "id"),
    )

    # The bus event's id when the row comes from one: a redelivered event inserts nothing.
    id: str = Field(primary_key=True, max_length=64)
    job_id: str = Field(max_length=64)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    level: str = Field(max_length=8)
    type: str = Field(max_length=16)
    message: str = Field(max_length=2000)
    data: bytes | None = Field(default=None, sa_type=sa.LargeBinary)


class CheckpointRow(SQLModel, table=True):
    __tablename__ = "scheduler_checkpoints"
    __table_args__ = (sa.UniqueConstraint("job_id", "step"),)

    id: str = Field(primary_key=True, max_length=64)
    job_id: str = Field(max_length=64, index=True)
    step: int
    uri: str = Field(max_length=1024)
    sha256: str | None = Field(default=None, max_length=64)
    train_loss: float | None = None
    task_score: float | None = None
    pruned: bool = False
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class AttemptRow(SQLModel, table=True):
    """One run of a job's trainer on one provider. A job's attempts are numbered from 1; the
    highest is the current one, the only one whose reports are taken (webhooks.py)."""

    __tablename__ = "scheduler_attempts"

    id: str = Field(primary_key=True, max_length=64)
    job_id: str = Field(max_length=64, index=True)
    number: int = 1
    provider: str = Field(max_length=32)
    # The provider's handle (local: "<pid>:<start time>") and the attempt's work directory.
    ref: str = Field(max_length=256)
    work_dir: str = Field(max_length=1024)
    # pending | running (live); exited | lost | preempted | cancelled (ended, as the provider
    # saw it end)
    state: str = Field(max_length=16)
    returncode: int | None = None
    reason: str | None = Field(default=None, max_length=1000)
    started_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    ended_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    # The checkpoint it went on from; the steps it reported first and last; its last report.
    resume_from: str | None = Field(default=None, max_length=1024)
    first_step: int | None = None
    last_step: int | None = None
    last_report_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    # Why the scheduler asked it to stop (rollover | pause | cancel | heartbeat), if it did.
    stop_requested: str | None = Field(default=None, max_length=16)
    # The failure the trainer reported (nan_loss, oom, error, ...), and whether it finished.
    failure: str | None = Field(default=None, max_length=32)
    completed: bool = False
    # What it ran on and at what price, kept with it: the ladder may change later.
    device: str | None = Field(default=None, max_length=64)
    device_count: int | None = None
    cost_per_hour: float | None = None
    # The job's trained tokens (non-pad, every step so far) when it started and at its last
    # report: the attempt trained the difference.
    tokens_start: int | None = Field(default=None, sa_type=sa.BigInteger)
    tokens_last: int | None = Field(default=None, sa_type=sa.BigInteger)


class TenantBudgetRow(SQLModel, table=True):
    """A tenant's own monthly cap on training cost (its admin sets it); the platform's cap
    (TUNELOOP_SCHEDULER_TENANT_MONTHLY_CAP) applies above it."""

    __tablename__ = "scheduler_tenant_budgets"

    tenant: str = Field(primary_key=True, max_length=63)
    monthly_cost_cap: float | None = None
    updated_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class RetrainPolicyRow(SQLModel, table=True):
    """A tenant's rule for training the next version from new traffic (retrain.py): which
    samples, when (a schedule, or N new samples), the job to run and whether to deploy it."""

    __tablename__ = "scheduler_retrain_policies"
    __table_args__ = (sa.UniqueConstraint("tenant", "name"),)

    id: str = Field(primary_key=True, max_length=40)
    tenant: str = Field(max_length=63, index=True)
    name: str = Field(max_length=64)
    enabled: bool = True
    # The policy as created (protocol.RetrainPolicyCreate): read whole, never filtered on.
    spec: bytes = Field(sa_type=sa.LargeBinary)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    updated_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    # Samples captured at or after it are new; None: no run yet, every matching sample is.
    watermark: datetime | None = Field(default=None, sa_type=UTCDateTime)
    runs: int = 0
    last_run_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    last_dataset_id: str | None = Field(default=None, max_length=64)
    last_job_id: str | None = Field(default=None, max_length=64)
    # Why the last try to run did not start a job (ingest away, the budget spent, ...).
    last_error: str | None = Field(default=None, max_length=2000)


class NotificationRuleRow(SQLModel, table=True):
    """A tenant's rule: which facts (notifications/schemas.py's RuleEvent) go to which URL, in
    which body format. Its signing secret is not stored: it is derived from the scheduler's
    secret, the rule's id and `secret_version` (notifications/signing.py)."""

    __tablename__ = "scheduler_notification_rules"
    __table_args__ = (sa.UniqueConstraint("tenant", "name"),)

    id: str = Field(primary_key=True, max_length=40)
    tenant: str = Field(max_length=63, index=True)
    name: str = Field(max_length=64)
    enabled: bool = True
    url: str = Field(max_length=2048)
    format: str = Field(max_length=8)
    # The rule as created (events, filter, thresholds): read whole, never filtered on.
    spec: bytes = Field(sa_type=sa.LargeBinary)
    secret_version: int = 1
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    updated_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class NotificationDeliveryRow(SQLModel, table=True):
    """One alert for one rule, the outbox: written in the same transaction that matched it, sent
    until delivered or given up. `id` is the webhook-id receivers deduplicate on; (rule, key)
    is unique, so a redelivered bus event or a second check enqueues nothing."""

    __tablename__ = "scheduler_notification_deliveries"
    __table_args__ = (
        sa.UniqueConstraint("rule_id", "key"),
        sa.Index("ix_scheduler_notification_deliveries_due", "status", "next_attempt_at"),
        sa.Index("ix_scheduler_notification_deliveries_rule_created", "rule_id", "created_at"),
    )

    id: str = Field(primary_key=True, max_length=40)
    rule_id: str = Field(max_length=40)
    tenant: str = Field(max_length=63)
    event: str = Field(max_length=32)
    # What the alert is about, once per rule: the bus event's id, or the check's own key.
    key: str = Field(max_length=200)
    # The URL and the exact body, as they were when enqueued: every attempt sends the same bytes.
    url: str = Field(max_length=2048)
    body: bytes = Field(sa_type=sa.LargeBinary)
    # pending (next_attempt_at says when) | delivered | failed (final answer, or given up)
    status: str = Field(max_length=16)
    attempts: int = 0
    next_attempt_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    last_status_code: int | None = None
    last_error: str | None = Field(default=None, max_length=500)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    delivered_at: datetime | None = Field(default=None, sa_type=UTCDateTime)


class NotificationAttemptRow(SQLModel, table=True):
    """One try at a delivery: when, what came back, how long it took, what followed."""

    __tablename__ = "scheduler_notification_attempts"
    __table_args__ = (sa.UniqueConstraint("delivery_id", "number"),)

    id: str = Field(primary_key=True, max_length=48)
    delivery_id: str = Field(max_length=40, index=True)
    number: int
    started_at: datetime = Field(sa_type=UTCDateTime)
    duration_ms: float
    status_code: int | None = None
    error: str | None = Field(default=None, max_length=500)
    # delivered | retry | failed
    outcome: str = Field(max_length=16)


class BudgetThresholdRow(SQLModel, table=True):
    """A percentage of a tenant's monthly cap its spend reached, once per month: the
    `job.budget_threshold_reached` event is published once for it."""

    __tablename__ = "scheduler_budget_thresholds"

    tenant: str = Field(primary_key=True, max_length=63)
    period_start: datetime = Field(primary_key=True, sa_type=UTCDateTime)
    percent: int = Field(primary_key=True)
    spent: float
    cap: float
    reached_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)

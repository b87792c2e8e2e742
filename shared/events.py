"""Every event on the tuneloop bus: one pydantic model per fact, with its subject and stream beside it.

Producers and consumers import the same class, never a subject string. Subjects carry the tenant
so NATS permissions can scope an integrator to its own events, and a version, so a breaking
change is a new subject rather than a surprise:

    tuneloop.<tenant>.<domain>.<fact>.v<version>      e.g. tuneloop.acme.job.progress.v1

Events are facts in past tense; each carries an id (also the JetStream message id, so a
re-published event is dropped by the stream's duplicate window), a time and a schema version.
Consumers must be idempotent: delivery is at-least-once.

`python -m shared.events` prints the catalogue.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, ClassVar, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, model_validator

from shared.chat import Sample
from shared.tasks import TaskKind
from shared.tenancy import TENANT_PATTERN, TenantId, is_tenant_id

SUBJECT_ROOT = "tuneloop"
# Tenant of platform-level facts (presence); a valid subject token no tenant slug can take.
SYSTEM_TENANT = "_system"
Metrics = dict[str, float]


@dataclass(frozen=True)
class Stream:
    """A JetStream stream and its limits; declared idempotently at start-up (shared.bus)."""

    name: str
    domain: str
    description: str
    max_age_days: float | None = None  # None: the settings' default
    max_msg_size: int = 1024 * 1024
    duplicate_window_s: float = 120.0

    @property
    def subjects(self) -> list[str]:
        return [f"{SUBJECT_ROOT}.*.{self.domain}.>"]


SAMPLES = Stream(
    "TUNELOOP_SAMPLES", "sample", "Captured samples, until persisted", max_msg_size=8 * 1024**2
)
# The capture pipeline's own facts (not samples): spill episodes, for tenants' alerts.
CAPTURE = Stream("TUNELOOP_CAPTURE", "capture", "Capture's episodes of keeping samples on disk")
DATASETS = Stream("TUNELOOP_DATASETS", "dataset", "Dataset builds")
JOBS = Stream("TUNELOOP_JOBS", "job", "Fine-tuning job lifecycle and training reports")
EVALS = Stream("TUNELOOP_EVALS", "eval", "Checkpoint evaluations")
MODELS = Stream("TUNELOOP_MODELS", "model", "Model registry changes")
DEPLOYMENTS = Stream("TUNELOOP_DEPLOYMENTS", "deployment", "Deployments of registered models")
# Messages a consumer can never handle, copied here before they are terminated (shared.deadletters):
# tuneloop.<tenant>.deadletter.<original subject after the tenant>, as large as any stream's.
DEADLETTERS = Stream(
    "TUNELOOP_DEADLETTERS",
    "deadletter",
    "Messages no consumer could handle, kept for an operator to list and replay",
    max_msg_size=SAMPLES.max_msg_size,
)
STREAMS: tuple[Stream, ...] = (
    SAMPLES,
    CAPTURE,
    DATASETS,
    JOBS,
    EVALS,
    MODELS,
    DEPLOYMENTS,
    DEADLETTERS,
)

CATALOGUE: dict[str, type[Event]] = {}


def _now() -> datetime:
    return datetime.now(UTC)


class Event(BaseModel):
    """Base of every bus event. Subclasses set `event_name` (domain.fact), `event_version` and `stream`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    event_name: ClassVar[str]
    event_version: ClassVar[int] = 1
    # None: core NATS only (ephemeral facts such as presence), never persisted.
    stream: ClassVar[Stream | None]
    # True: `bus.publish_many` may send several events of one subject as one message (a
    # bundle), which only `bus.consume_batches` reads; for high-volume facts, where a message
    # per event costs more on the bus than the event itself.
    bundled: ClassVar[bool] = False

    event_id: str = Field(
        default_factory=lambda: uuid.uuid4().hex,
        min_length=1,
        max_length=128,
        description="unique; also the JetStream Nats-Msg-Id: consume idempotently by it",
    )
    occurred_at: AwareDatetime = Field(default_factory=_now, description="when, with its zone")
    # Stamped with the class's event_version when absent (see _stamp_version).
    schema_version: int = 0
    tenant: TenantId = Field(description="whose fact; also the subject's second token")

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "event_name" not in cls.__dict__:
            return  # an intermediate base, not an event
        key = f"{cls.event_name}.v{cls.event_version}"
        if key in CATALOGUE:
            raise TypeError(
                f"event {key} is defined twice ({CATALOGUE[key].__name__}, {cls.__name__})"
            )
        CATALOGUE[key] = cls

    @model_validator(mode="before")
    @classmethod
    def _stamp_version(cls, data: Any) -> Any:
        if isinstance(data, dict) and "schema_version" not in data:
            return {**data, "schema_version": cls.event_version}
        return data

    @model_validator(mode="after")
    def _check_version(self) -> Event:
        if self.schema_version != self.event_version:
            raise ValueError(
                f"schema_version {self.schema_version} does not match "
                f"{type(self).__name__} v{self.event_version}; a breaking change is a new subject"
            )
        return self

    @classmethod
    def subject_for(cls, tenant: str) -> str:
        if tenant != SYSTEM_TENANT and not is_tenant_id(tenant):
            raise ValueError(f"tenant {tenant!r} is not a valid subject token ({TENANT_PATTERN})")
        return f"{SUBJECT_ROOT}.{tenant}.{cls.event_name}.v{cls.event_version}"

    @classmethod
    def subject_pattern(cls) -> str:
        """The subject a consumer of every tenant's events subscribes to."""
        return f"{SUBJECT_ROOT}.*.{cls.event_name}.v{cls.event_version}"

    @property
    def subject(self) -> str:
        return self.subject_for(self.tenant)


class SystemEvent(Event):
    tenant: Literal["_system"] = SYSTEM_TENANT  # type: ignore[assignment]


# --- platform ---------------------------------------------------------------------------------


class ServiceHeartbeat(SystemEvent):
    """A service instance is alive; sent every few seconds so peers and `status` see who is up."""

    event_name = "service.heartbeat"
    stream = None
    service: str
    instance_id: str
    address: str
    started_at: AwareDatetime


# --- samples and datasets ---------------------------------------------------------------------


class SampleCaptured(Event):
    """A call, upload line or trace became a canonical sample; the ingest persister stores it.

    A sample whose event would pass `INLINE_SAMPLE_MAX_BYTES` travels by reference: `sample` is
    None and `sample_ref` is the s3:// URI of its JSON under the tenant's prefix, written before
    the event is published (the persister reads it from there)."""

    event_name = "sample.captured"
    stream = SAMPLES
    bundled = True
    sample: Sample | None = None
    sample_ref: str | None = None

    @model_validator(mode="after")
    def _one_sample(self) -> SampleCaptured:
        if (self.sample is None) == (self.sample_ref is None):
            raise ValueError("exactly one of sample and sample_ref must be given")
        if self.sample is not None and self.sample.tenant != self.tenant:
            raise ValueError(
                f"sample.tenant {self.sample.tenant!r} differs from event tenant {self.tenant!r}"
            )
        return self


# Larger sample.captured events carry their sample by reference: a whole bundle's worth
# (shared.bus.MAX_BUNDLE_BYTES), far below the samples stream's message limit, so the stream
# never refuses a sample for its size whatever the gateway accepted.
INLINE_SAMPLE_MAX_BYTES = 1024 * 1024


class CaptureSpilled(Event):
    """Some of a tenant's captured samples waited in an ingest process's spill file while NATS
    or S3 were away, and have all been delivered since: one per tenant and episode, published
    by that ingest once its spill file is empty and the bus is back
    (services/ingest/capture/spill_watch.py). The calls themselves were answered all along; `refused`
    samples were lost to capture."""

    event_name = "capture.spilled"
    stream = CAPTURE
    started_at: AwareDatetime = Field(description="the episode's first sample spilled")
    ended_at: AwareDatetime = Field(description="the spill file seen empty again")
    samples: int = Field(ge=0, description="this tenant's samples kept in the spill file")
    bytes: int = Field(ge=0, description="their size there")
    refused: int = Field(
        default=0, ge=0, description="this tenant's samples refused at the spill file's cap"
    )
    max_backlog_fraction: float = Field(
        ge=0,
        le=1,
        description="the fullest the spill file got, over every tenant, as a fraction of its "
        "cap (TUNELOOP_INGEST_SPILL_MAX_BYTES): how near capture came to refusing samples",
    )


class DatasetBuildRequested(Event):
    """Someone asked for a dataset to be built from a filter over samples or from files."""

    event_name = "dataset.build_requested"
    stream = DATASETS
    dataset_id: str
    spec: dict[str, Any]


class DatasetBuildProgressed(Event):
    """A dataset build moved on: which cleaning step ran and how many samples remain."""

    event_name = "dataset.build_progressed"
    stream = DATASETS
    dataset_id: str
    step: str
    samples_in: int = Field(ge=0)
    samples_out: int = Field(ge=0)


class DatasetBuilt(Event):
    """A dataset version is complete and immutable in object storage."""

    event_name = "dataset.built"
    stream = DATASETS
    dataset_id: str
    dataset_version: str = Field(description="content hash of the snapshot")
    uri: str
    train_count: int = Field(ge=0)
    eval_count: int = Field(ge=0)


class DatasetBuildFailed(Event):
    """A dataset build ended without a dataset; `reason` says why."""

    event_name = "dataset.build_failed"
    stream = DATASETS
    dataset_id: str
    reason: str


# --- fine-tuning jobs -------------------------------------------------------------------------


class JobEvent(Event):
    job_id: str


class AttemptEvent(JobEvent):
    attempt_id: str


class JobCreated(JobEvent):
    """A fine-tuning job was accepted: base model, dataset version, method and hyperparameters."""

    event_name = "job.created"
    stream = JOBS
    base_model: str
    dataset_uri: str
    method: Literal["lora", "qlora", "full"]
    hyperparameters: dict[str, Any] = Field(default_factory=dict)
    suffix: str | None = None


class JobQueued(JobEvent):
    """The job is planned and waits to be placed on a provider of the GPU ladder."""

    event_name = "job.queued"
    stream = JOBS
    position: int = Field(ge=0)


class JobAssigned(AttemptEvent):
    """The scheduler placed an attempt of the job on a provider of the GPU ladder."""

    event_name = "job.assigned"
    stream = JOBS
    provider: str
    resources: dict[str, Any] = Field(default_factory=dict)
    resume_from: str | None = None


class JobStarted(AttemptEvent):
    """A trainer began an attempt of the job on `provider` (its first report)."""

    event_name = "job.started"
    stream = JOBS
    provider: str


class JobProgressed(AttemptEvent):
    """A training report: where the run is and how it is going."""

    event_name = "job.progress"
    stream = JOBS
    step: int = Field(ge=0)
    total_steps: int | None = Field(default=None, ge=0)
    epoch: float = Field(ge=0)
    loss: float
    learning_rate: float
    grad_norm: float | None = None
    tokens_per_s: float | None = Field(default=None, ge=0)
    eta_s: float | None = Field(default=None, ge=0)


class CheckpointSaved(AttemptEvent):
    """A complete checkpoint (manifest and commit marker written) is in object storage."""

    event_name = "job.checkpoint_saved"
    stream = JOBS
    step: int = Field(ge=0)
    uri: str
    metrics: Metrics = Field(default_factory=dict)


class JobRolledOver(JobEvent):
    """An attempt ended early (provider time limit, crash, NaN) and a new one resumes from a checkpoint."""

    event_name = "job.rolled_over"
    stream = JOBS
    from_attempt_id: str
    to_attempt_id: str
    reason: Literal["time_limit", "crash", "nan_loss", "preempted", "provider_unavailable"]
    resume_from: str | None


class JobEarlyStopRequested(JobEvent):
    """Training should end now, keeping the best checkpoint: the evaluator saw the task score
    fall while the loss kept falling (overfitting). The scheduler stops the run as it stops one
    at its budget: the trainer checkpoints, training ends there and the decision follows."""

    event_name = "job.early_stop_requested"
    stream = JOBS
    reason: str = Field(min_length=1, max_length=1000)
    requested_by: str = Field(default="evaluator", max_length=64)


class RetrainTriggered(Event):
    """A retrain policy ran: a dataset of the traffic it selects is building and a job will
    train on it (the job's own events follow)."""

    event_name = "job.retrain_triggered"
    stream = JOBS
    policy_id: str
    policy_name: str
    reason: str = Field(description="why it ran now, in words")
    new_samples: int = Field(ge=0)
    dataset_id: str
    job_id: str


class TrainingBudgetThresholdReached(Event):
    """A tenant's training spend this calendar month (UTC) reached `percent` of the monthly
    cap that applies to it (the scheduler's budgets.py); published once per percentage and
    month: 50, 80 and 100, and each percentage one of the tenant's notification rules names."""

    event_name = "job.budget_threshold_reached"
    stream = JOBS
    percent: int = Field(ge=1, le=100)
    spent: float = Field(ge=0, description="USD at the ladder's prices, this month so far")
    cap: float = Field(ge=0, description="the cap that applies: the tenant's or the platform's")
    period_start: AwareDatetime
    resets_at: AwareDatetime


class JobSucceeded(JobEvent):
    """The job is done: its chosen checkpoint is registered as a model version
    (`artifact_uri`), with its scores as `metrics`."""

    event_name = "job.succeeded"
    stream = JOBS
    artifact_uri: str
    metrics: Metrics = Field(default_factory=dict)


class JobFailed(JobEvent):
    """The job failed for good: `reason` is a code, `message` says it in words."""

    event_name = "job.failed"
    stream = JOBS
    reason: str = Field(description="machine-readable code, e.g. nan_loss, oom, bad_dataset")
    message: str
    last_checkpoint_uri: str | None = None


class JobCancelled(JobEvent):
    """The job was cancelled; its trainer is given time to checkpoint, then stopped."""

    event_name = "job.cancelled"
    stream = JOBS
    requested_by: str
    last_checkpoint_uri: str | None = None


class JobPlanned(JobEvent):
    """The recipe planned the job: what the evaluator scores, when, and what the hoster registers.

    Published once the dataset is built and before the trainer starts, so the base model can be
    scored while training sets up. `eval_every` 0 means the job has no evals (no eval split):
    the last checkpoint is registered without a gate.
    """

    event_name = "job.planned"
    stream = JOBS
    base_model: str = Field(description="catalogue id")
    dataset_id: str
    dataset_version: str
    dataset_uri: str
    task_kind: TaskKind
    steps: int = Field(ge=1)
    eval_every: int = Field(ge=0)
    eval_items: int = Field(ge=0, description="items of the fixed eval subset")
    fine_tuned_model: str = Field(description="ft:<base>:<suffix>:<job>")
    auto_deploy: bool = False


class TrainingCompleted(AttemptEvent):
    """The trainer finished: every checkpoint it will write is saved. The job succeeds only once
    the evaluator's decision is made and the chosen checkpoint is registered (job.succeeded)."""

    event_name = "job.training_completed"
    stream = JOBS
    artifact_uri: str
    last_step: int = Field(ge=0)
    last_checkpoint_uri: str | None = None
    trained_tokens: int | None = Field(default=None, ge=0)
    metrics: Metrics = Field(default_factory=dict)


# --- evaluation -------------------------------------------------------------------------------


class EvalCompleted(JobEvent):
    """A checkpoint was evaluated on the held-out task data."""

    event_name = "eval.completed"
    stream = EVALS
    checkpoint_uri: str
    step: int = Field(ge=0)
    scores: Metrics
    sample_count: int = Field(ge=0)
    outputs_uri: str | None = None


class BestCheckpointChanged(JobEvent):
    """A checkpoint became the job's best so far by the task score (`metric`, `value`)."""

    event_name = "eval.best_checkpoint_changed"
    stream = EVALS
    checkpoint_uri: str
    step: int = Field(ge=0)
    metric: str
    value: float
    previous_uri: str | None = None


class BaseScored(JobEvent):
    """The base model was scored on the job's eval subset before training (the bar to beat)."""

    event_name = "eval.base_scored"
    stream = EVALS
    base_model: str
    score: float = Field(ge=0, le=1)
    sample_count: int = Field(ge=0)
    outputs_uri: str | None = None


class EvalDecided(JobEvent):
    """The final decision: which checkpoint is the job's model, its scores, and the gate.

    Carries what the hoster registers, so registration needs no other service's state. `gate`
    None: the job had no evals, the last checkpoint is the choice and nothing was gated.

    v2: the version serving the job's served name (its suffix) when the job auto-deploys,
    `serving_version_id` and `serving_score` on the same eval items as `best_score`, and
    `beats_serving` (None: nothing serves the name, no auto_deploy, or the gate rejected it),
    which the hoster reads before making the new version that name's canary.
    """

    event_name = "eval.decided"
    event_version = 2
    stream = EVALS
    base_model: str
    fine_tuned_model: str
    dataset_id: str
    dataset_version: str
    best_step: int = Field(ge=0)
    best_checkpoint_uri: str
    best_score: float | None = None
    base_score: float | None = None
    scores: dict[int, float] = Field(default_factory=dict, description="task score by step")
    gate: Literal["passed", "rejected"] | None = None
    gate_reason: str = ""
    auto_deploy: bool = False
    serving_version_id: str | None = None
    serving_score: float | None = None
    beats_serving: bool | None = None


class PairwiseScore(BaseModel):
    """A shadow judged against its primary on the calls mirrored to both: the pairs counted,
    the shadow's win rate (wins + ties/2) / decided with its 95 % Wilson interval, and the
    verdict: `better` (the interval's lower bound above 0.5), `worse` (its upper bound below
    0.5), else `undecided` (also with fewer than `min_pairs` decided pairs)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    pairs: int = Field(ge=0, description="every pair captured, whatever became of it")
    shadow_wins: int = Field(ge=0)
    primary_wins: int = Field(ge=0)
    ties: int = Field(ge=0)
    judge_errors: int = Field(ge=0, description="pairs the judge could not answer: not decided")
    shadow_failures: int = Field(ge=0, description="pairs whose shadow failed: not judged")
    decided: int = Field(ge=0, description="shadow wins + primary wins + ties")
    win_rate: float | None = Field(default=None, ge=0, le=1)
    low: float | None = Field(default=None, ge=0, le=1)
    high: float | None = Field(default=None, ge=0, le=1)
    min_pairs: int = Field(ge=0, description="decided pairs needed before a verdict")
    verdict: Literal["better", "worse", "undecided"]

    def describe(self) -> str:
        """The numbers in words, for a refusal or a log line."""
        rate = (
            f"win rate {self.win_rate:.2f} (95 % interval {self.low:.2f}-{self.high:.2f})"
            if self.win_rate is not None and self.low is not None and self.high is not None
            else "no win rate"
        )
        return (
            f"{self.verdict}: {rate} over {self.decided} decided pairs (at least "
            f"{self.min_pairs} needed): {self.shadow_wins} shadow wins, {self.primary_wins} "
            f"primary wins, {self.ties} ties; {self.judge_errors} judge errors and "
            f"{self.shadow_failures} shadow failures of {self.pairs} pairs"
        )


class ShadowScored(Event):
    """A served name's shadow was scored pairwise against its primary (the evaluator's
    services/evaluator/shadow.py), for this pair of versions: the counts so far and the verdict
    the hoster's promote and automatic rollback read."""

    event_name = "eval.shadow_scored"
    stream = EVALS
    name: str = Field(min_length=1, max_length=256, description="the served name")
    primary_version: str
    shadow_version: str
    score: PairwiseScore


# --- registry and deployments -----------------------------------------------------------------


class ModelRegistered(Event):
    """A checkpoint became a model version in the registry, with its lineage.

    v2: the version's served name, checkpoint step and digest, scores and gate (v1 had no
    producer or consumer)."""

    event_name = "model.registered"
    event_version = 2
    stream = MODELS
    model_id: str = Field(description="the ft: name the version is served under")
    model_version: int = Field(ge=1)
    version_id: str
    artifact_uri: str
    sha256: str
    base_model: str
    job_id: str | None = None
    dataset_id: str | None = None
    dataset_version: str | None = None
    step: int | None = Field(default=None, ge=0)
    scores: Metrics = Field(default_factory=dict)
    gate: Literal["passed", "rejected"] | None = None


class ModelAliasChanged(Event):
    """An alias of an ft: name (`<name>@<alias>`) was set, moved or removed (`model_version`
    None)."""

    event_name = "model.alias_changed"
    stream = MODELS
    model_id: str
    alias: str
    model_version: int | None = Field(default=None, ge=1)
    version_id: str | None = None
    previous_version: int | None = None


class DeploymentEvent(Event):
    deployment_id: str


class DeploymentReady(DeploymentEvent):
    """A deployment serves; the gateway routes `served_model_name` to `endpoint_url`, the
    engine's OpenAI base URL (`http://host:port/v1`, what an SDK takes as base_url).

    v2: the registry version it serves (`version_id`), which the gateway tags captured answers
    with. The engine answers to `served_model_name` itself: the gateway rewrites no body.

    The hoster also re-announces every live deployment now and then (`cold`: one unloaded for
    idling, whose next call wakes it), so a gateway that starts after the stream's retention
    dropped the first announcement still routes it."""

    event_name = "deployment.ready"
    event_version = 2
    stream = DEPLOYMENTS
    served_model_name: str
    endpoint_url: str
    version_id: str | None = None
    cold: bool = False


class DeploymentFailed(DeploymentEvent):
    """A deployment could not start, or its engine crashed too often to be started again.

    v2: what it was serving, `served_model_name` (the version's ft: name) and `served_name`
    (the stable name it was deployed under; None: its own name only), so a notification rule
    filtered by served name is told of its own name's failures only (v1 named neither)."""

    event_name = "deployment.failed"
    event_version = 2
    stream = DEPLOYMENTS
    served_model_name: str
    served_name: str | None = None
    reason: str


class DeploymentStopped(DeploymentEvent):
    """A deployment was undeployed: the gateway stops routing `served_model_name` to it."""

    event_name = "deployment.stopped"
    stream = DEPLOYMENTS
    served_model_name: str
    reason: str = "requested"


class CanaryPolicy(BaseModel):
    """When a canary is rolled back by itself: over its last `min_requests` calls (at least),
    an error rate (5xx, unreachable) above `max_error_rate` or a p95 latency above
    `max_p95_ms` (None: latency is not judged). When a shadow is: `shadow_worse` (the
    evaluator's pairwise score says it is worse than the primary)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    min_requests: int = Field(default=50, ge=5, le=100_000)
    max_error_rate: float = Field(default=0.05, ge=0, le=1)
    max_p95_ms: float | None = Field(default=None, gt=0)
    shadow_worse: bool = Field(
        default=True, description="take the shadow out when its pairwise verdict is `worse`"
    )


class ServedTarget(BaseModel):
    """One deployment behind a served name: where the gateway sends the calls it gets."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    deployment_id: str
    endpoint_url: str
    version_id: str | None = None
    # The name its engine answers to (the version's ft: name): the gateway puts it in the
    # body's `model` in place of the served name, as engines answer their own names only.
    model: str | None = None


class ServedNameChanged(Event):
    """What answers a tenant's served name now: `primary`; `canary` for `canary_percent` of the
    calls (split by the caller's X-Request-Id, else by tenant and body, so a retry lands on the
    same version); `shadow`, mirrored `shadow_percent` of the answered ones. The gateway keeps
    the highest `revision` it has seen per name."""

    event_name = "deployment.served_name_changed"
    stream = DEPLOYMENTS
    name: str = Field(min_length=1, max_length=256)
    revision: int = Field(ge=1)
    primary: ServedTarget | None = None
    canary: ServedTarget | None = None
    canary_percent: float = Field(default=0.0, ge=0, le=100)
    rollback: CanaryPolicy = Field(default_factory=CanaryPolicy)
    # Mirrored `shadow_percent` of the primary's calls after they are answered: its answers
    # are kept as samples (purpose:shadow, paired with the primary's), never returned.
    shadow: ServedTarget | None = None
    shadow_percent: float = Field(default=0.0, ge=0, le=100)


class CanaryFailed(Event):
    """A gateway saw a served name's canary cross its policy (and stopped sending it calls):
    the hoster rolls it back. The numbers are that gateway's window."""

    event_name = "deployment.canary_failed"
    stream = DEPLOYMENTS
    name: str
    revision: int = Field(ge=1)
    deployment_id: str
    requests: int = Field(ge=0)
    errors: int = Field(ge=0)
    p95_ms: float | None = None
    reason: str


class DeploymentRolledBack(DeploymentEvent):
    """A served name went back: its canary or shadow (`deployment_id`) was taken out, or its
    primary returned to the version before; the numbers when a canary's calls or a shadow's
    pairwise score decided it."""

    event_name = "deployment.rolled_back"
    stream = DEPLOYMENTS
    name: str
    restored_deployment_id: str | None = None
    reason: str
    requests: int | None = None
    errors: int | None = None
    p95_ms: float | None = None
    # A shadow taken out because its pairwise score said it is worse (reason `shadow_worse`).
    shadow_score: PairwiseScore | None = None


class DeploymentCold(DeploymentEvent):
    """A deployment no call reached for `idle_s` was unloaded (neither failed nor stopped): its
    next call wakes it (the hoster's `POST /internal/deployments/{id}/wake`) and waits for it;
    `deployment.ready` follows at its address, which may be a new one."""

    event_name = "deployment.cold"
    stream = DEPLOYMENTS
    served_model_name: str
    idle_s: float = Field(ge=0)


def catalogue_rows() -> list[tuple[str, str, str, str]]:
    """(subject pattern, stream, class, summary) for every event, for docs and the CLI."""
    rows = []
    for cls in CATALOGUE.values():
        summary = (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""
        stream = cls.stream.name if cls.stream else "(core NATS)"
        rows.append((cls.subject_pattern(), stream, cls.__name__, summary))
    return rows


if __name__ == "__main__":
    for subject, stream, cls_name, summary in catalogue_rows():
        print(f"{subject:52} {stream:22} {cls_name:24} {summary}")

"""The fine-tuning jobs API's request and response shapes: OpenAI's, field for field, plus ours.

An `openai` SDK user sends exactly what they send OpenAI; our extensions (`max_duration_s`,
`auto_deploy`) travel as the SDK's `extra_body` and are documented here for the OpenAPI
document. Objects carry OpenAI's fields and add `decisions`, `base_score`, `best_step` and
`gate`, which the SDK keeps as extra attributes.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

Auto = Literal["auto"]
Priority = Literal["urgent", "normal", "batch"]
EventLevel = Literal["info", "warn", "error"]
JobStatus = Literal[
    "validating_files", "queued", "running", "paused", "succeeded", "failed", "cancelled"
]
TERMINAL: frozenset[str] = frozenset({"succeeded", "failed", "cancelled"})
# OpenAI's own limits for these fields.
N_EPOCHS = Annotated[int, Field(ge=1, le=50)]
BATCH_SIZE = Annotated[int, Field(ge=1, le=256)]
LR_MULTIPLIER = Annotated[float, Field(gt=0, le=10)]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Hyperparameters(_Request):
    """Each `"auto"` (the recipe decides, and says why) or a value (the user's wins)."""

    n_epochs: Auto | N_EPOCHS = "auto"
    batch_size: Auto | BATCH_SIZE = "auto"
    learning_rate_multiplier: Auto | LR_MULTIPLIER = "auto"


class Supervised(_Request):
    hyperparameters: Hyperparameters = Hyperparameters()


class Method(_Request):
    type: Literal["supervised"] = Field(
        description="Only supervised fine-tuning is offered; dpo and reinforcement are refused."
    )
    supervised: Supervised = Supervised()


class JobTemplate(_Request):
    """A job without its training data: what a retrain policy starts each time it runs, and
    the part of every job request that is not its files."""

    model: str = Field(min_length=1, description="A base model of the catalogue (GET /v1/models)")
    hyperparameters: Hyperparameters | None = Field(
        default=None, description="Deprecated by OpenAI in favour of method; still accepted"
    )
    method: Method | None = None
    suffix: str | None = Field(
        default=None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$"
    )
    seed: int | None = Field(default=None, ge=0, le=2**31 - 1)
    metadata: (
        dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]] | None
    ) = Field(default=None, max_length=16)
    # tuneloop's extensions, sent by SDK users as extra_body.
    max_duration_s: float | None = Field(
        default=None,
        gt=0,
        le=7 * 86_400,
        description="tuneloop: time budget: the recipe plans steps and evals to fit it, and "
        "training stops at it (its attempts' time, queueing excluded), keeping the best",
    )
    max_cost: float | None = Field(
        default=None,
        gt=0,
        description="tuneloop: cost budget (USD at the ladder's prices); training stops at "
        "it, keeping the best",
    )
    priority: Priority = Field(
        default="normal",
        description="tuneloop: urgent jobs are placed before normal ones, batch jobs last and "
        "only inside the scheduler's batch window",
    )

    @model_validator(mode="after")
    def _one_place_for_hyperparameters(self) -> Self:
        given = self.hyperparameters not in (None, Hyperparameters())
        if given and self.method is not None:
            raise ValueError(
                "hyperparameters: give them in method.supervised.hyperparameters or the "
                "deprecated top-level field, not both"
            )
        return self

    def chosen(self) -> Hyperparameters:
        if self.method is not None:
            return self.method.supervised.hyperparameters
        return self.hyperparameters or Hyperparameters()


class JobCreate(JobTemplate):
    training_file: str = Field(min_length=1, description="An uploaded file id or a dataset id")
    validation_file: str | None = Field(
        default=None, description="Becomes the dataset's eval split (never trained on)"
    )
    integrations: list[dict[str, Any]] | None = Field(
        default=None, description="Not offered: a non-empty list is refused", max_length=0
    )
    auto_deploy: bool = Field(
        default=False, description="tuneloop: deploy the registered version if it passes the gate"
    )


class JobError(BaseModel):
    code: str
    message: str
    param: str | None = None


class DecisionOut(BaseModel):
    name: str
    value: Any
    reason: str
    source: Literal["auto", "user"]


class ResolvedHyperparameters(BaseModel):
    n_epochs: float
    batch_size: int
    learning_rate_multiplier: float


class Job(BaseModel):
    object: Literal["fine_tuning.job"] = "fine_tuning.job"
    id: str
    created_at: int
    finished_at: int | None = None
    model: str
    fine_tuned_model: str | None = None
    organization_id: str
    status: JobStatus
    hyperparameters: ResolvedHyperparameters | None = None
    method: dict[str, Any]
    training_file: str
    validation_file: str | None = None
    result_files: list[str] = Field(default_factory=list)
    trained_tokens: int | None = None
    error: JobError | None = None
    seed: int
    estimated_finish: int | None = None
    integrations: list[dict[str, Any]] = Field(default_factory=list)
    metadata: dict[str, str] | None = None
    suffix: str | None = None
    # tuneloop's own.
    max_duration_s: float | None = None
    max_cost: float | None = None
    auto_deploy: bool = False
    priority: Priority = "normal"
    decisions: list[DecisionOut] = Field(default_factory=list)
    base_score: float | None = None
    best_step: int | None = None
    gate: Literal["passed", "rejected"] | None = None


class JobList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Job]
    has_more: bool


class JobEvent(BaseModel):
    object: Literal["fine_tuning.job.event"] = "fine_tuning.job.event"
    id: str
    created_at: int
    level: EventLevel
    message: str
    type: Literal["message", "metrics"] = "message"
    data: dict[str, Any] | None = None


class JobEventList(BaseModel):
    object: Literal["list"] = "list"
    data: list[JobEvent]
    has_more: bool


class CheckpointMetrics(BaseModel):
    step: int
    train_loss: float | None = None
    task_score: float | None = None
    full_valid_loss: float | None = None


class Checkpoint(BaseModel):
    object: Literal["fine_tuning.job.checkpoint"] = "fine_tuning.job.checkpoint"
    id: str
    created_at: int
    fine_tuned_model_checkpoint: str
    fine_tuning_job_id: str
    step_number: int
    metrics: CheckpointMetrics


class CheckpointList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Checkpoint]
    has_more: bool
    first_id: str | None = None
    last_id: str | None = None


class UsageLine(BaseModel):
    provider: str
    device: str | None
    attempts: int
    device_hours: float
    cost: float
    # Non-pad tokens the attempts trained (steps an attempt redid after a resume count again).
    trained_tokens: int = 0
    # False: the rung is no longer in the ladder, so its price is unknown (counted as 0).
    priced: bool = True


class Usage(BaseModel):
    object: Literal["fine_tuning.usage"] = "fine_tuning.usage"
    since: datetime | None
    data: list[UsageLine]
    device_hours: float
    cost: float
    trained_tokens: int = 0


class BudgetUpdate(BaseModel):
    monthly_cost_cap: float | None = Field(
        ge=0, description="USD a calendar month (UTC) of training; null: no cap of the tenant's own"
    )


class Budget(BaseModel):
    object: Literal["fine_tuning.budget"] = "fine_tuning.budget"
    # The tenant's own cap, the platform's, and the one that applies (the lower).
    monthly_cost_cap: float | None
    platform_monthly_cost_cap: float | None
    effective_monthly_cost_cap: float | None
    period_start: datetime
    resets_at: datetime
    spent: float


def fine_tuned_name(base: str, suffix: str | None, job_id: str) -> str:
    """`ft:<base>:<suffix>:<job>` (an empty suffix leaves `::`, as OpenAI's names do). Models are
    routed per tenant, so the name needs no organisation part; every part is colon-free by
    construction (catalogue ids, the suffix pattern, job ids)."""
    return f"ft:{base}:{suffix or ''}:{job_id}"


def checkpoint_name(fine_tuned: str, step: int) -> str:
    return f"{fine_tuned}:ckpt-step-{step}"


# --- retrain policies (tuneloop's own) ----------------------------------------------------------

POLICY_NAME = r"^[a-z0-9][a-z0-9_-]{0,63}$"


class RetrainTrigger(_Request):
    """When a policy runs: once `min_new_samples` new samples match its source, and/or every
    `every_s` seconds if any new sample does (nothing new, nothing to learn)."""

    min_new_samples: int | None = Field(default=None, ge=1, le=100_000_000)
    every_s: float | None = Field(default=None, ge=1, le=366 * 86_400)

    @model_validator(mode="after")
    def _something(self) -> Self:
        if self.min_new_samples is None and self.every_s is None:
            raise ValueError("trigger: give min_new_samples, every_s or both")
        return self


class RetrainPolicyCreate(_Request):
    name: str = Field(pattern=POLICY_NAME, description="unique per tenant; names its datasets")
    # Ingest's dataset `source` (a sample filter) and its `cleaning` / `split` options, checked
    # by ingest when the policy is made. The platform's own traffic (judge, shadow, evals) is
    # left out unless the filter names it; `feedback_label` / `min_feedback_score` keep only
    # samples with good feedback.
    source: dict[str, Any] = Field(default_factory=dict)
    cleaning: dict[str, Any] | None = None
    split: dict[str, Any] | None = None
    trigger: RetrainTrigger
    job: JobTemplate
    auto_deploy: bool = Field(
        default=False, description="deploy each new version that passes its gate"
    )
    enabled: bool = True
    # A team that trained by hand and now hands the next versions to a policy counts new
    # traffic from then on; without it every matching sample is new and the first run is due at
    # once when enough was captured before.
    new_since: int | None = Field(
        default=None,
        ge=0,
        description="unix seconds: only samples captured at or after it count toward the "
        "first run's trigger (its dataset still selects everything the filter matches)",
    )


class RetrainPolicyUpdate(_Request):
    enabled: bool | None = None
    trigger: RetrainTrigger | None = None
    auto_deploy: bool | None = None


class RetrainPolicy(BaseModel):
    object: Literal["fine_tuning.retrain_policy"] = "fine_tuning.retrain_policy"
    id: str
    name: str
    enabled: bool
    created_at: int
    source: dict[str, Any]
    cleaning: dict[str, Any] | None = None
    split: dict[str, Any] | None = None
    trigger: RetrainTrigger
    job: JobTemplate
    auto_deploy: bool
    # Samples captured at or after it count as new (unix seconds); None: no run yet.
    watermark: int | None = None
    runs: int
    last_run_at: int | None = None
    last_dataset_id: str | None = None
    last_job_id: str | None = None
    last_error: str | None = None


class RetrainPolicyList(BaseModel):
    object: Literal["list"] = "list"
    data: list[RetrainPolicy]
    has_more: bool = False

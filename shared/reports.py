"""Trainer reports: the JSON bodies the trainer POSTs over signed webhooks, one definition for both ends.

The trainer (producer, `services.trainer.reporter`) builds and sends them; the scheduler's webhook
receiver (consumer) parses them with `parse_report` and maps each to its bus event. Field names
follow `shared.events` (`JobProgressed`, `CheckpointSaved`, `JobSucceeded`, `JobFailed`) so that
mapping is a field-for-field copy.

Every report carries a `report_id` (the receiver's idempotency key: a retried POST may arrive
twice) and a `seq`, monotonic within an attempt, so the receiver can order and spot gaps.
Floats must be finite: JSON has no NaN, and a NaN loss is reported as `failed(nan_loss)`.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Annotated, Any, Final, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from shared.chat.schema import error_path
from shared.tenancy import TenantId

REPORT_SCHEMA_VERSION: Final = 1
Metrics = dict[str, float]
FailureReason = Literal["nan_loss", "error", "oom", "bad_config", "bad_dataset", "interrupted"]
Method = Literal["lora", "qlora", "full"]


class ReportError(ValueError):
    """A report body is not valid JSON or not a valid report; the message names the field."""


def _now() -> datetime:
    return datetime.now(UTC)


class _Report(BaseModel):
    """Fields every report has: who sent it, in which order, when."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    schema_version: Literal[1] = REPORT_SCHEMA_VERSION
    report_id: str = Field(default_factory=lambda: uuid.uuid4().hex, pattern=r"^[0-9a-f]{32}$")
    seq: int = Field(ge=0, description="monotonic per attempt, from 0")
    job_id: str = Field(min_length=1, max_length=128)
    attempt_id: str = Field(min_length=1, max_length=128)
    tenant: TenantId
    occurred_at: AwareDatetime = Field(default_factory=_now)


class SkippedCheckpoint(BaseModel):
    """A checkpoint the trainer tried to resume from and could not use, and why."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    uri: str = Field(min_length=1)
    error: str = Field(description="e.g. a file's sha256 differs from the manifest's")


class StartedReport(_Report):
    """The attempt set up its model and data and is about to take its first (or resumed) step."""

    kind: Literal["started"] = "started"
    world_size: int = Field(ge=1)
    total_steps: int | None = Field(default=None, ge=0)
    resumed_from: str | None = None
    # The checkpoints tried before `resumed_from` and skipped (missing, uncommitted, failing
    # their sha256 check), in the order tried. Left out of the body when empty, so a receiver
    # of an older release (which forbids unknown fields) still takes the usual report.
    resume_skipped: list[SkippedCheckpoint] = Field(
        default_factory=list, exclude_if=lambda skipped: not skipped
    )
    device: str = Field(min_length=1, description="e.g. cpu, cuda:0 (NVIDIA H100 80GB)")
    method: Method
    trained_tokens: int | None = Field(
        default=None, ge=0, description="non-pad tokens of the steps it resumed after (0 fresh)"
    )


class ProgressReport(_Report):
    """Where the run is and how it goes; the same fields as `shared.events.JobProgressed`."""

    kind: Literal["progress"] = "progress"
    step: int = Field(ge=0)
    total_steps: int | None = Field(default=None, ge=0)
    epoch: float = Field(ge=0)
    loss: float
    learning_rate: float
    grad_norm: float | None = None
    tokens_per_s: float | None = Field(default=None, ge=0, description="non-pad tokens/s")
    eta_s: float | None = Field(default=None, ge=0)
    trained_tokens: int | None = Field(
        default=None, ge=0, description="non-pad tokens of every step so far, resumed ones included"
    )


class CheckpointSavedReport(_Report):
    """A committed checkpoint (manifest and marker written); fields of `CheckpointSaved`."""

    kind: Literal["checkpoint_saved"] = "checkpoint_saved"
    step: int = Field(ge=0)
    uri: str = Field(min_length=1)
    metrics: Metrics = Field(default_factory=dict)


class CompletedReport(_Report):
    """Training finished and the final artifact is stored; fields of `JobSucceeded` plus more
    (`TrainingCompleted` too, with its `last_step` as `steps`)."""

    kind: Literal["completed"] = "completed"
    artifact_uri: str = Field(min_length=1)
    merged_uri: str | None = None
    metrics: Metrics = Field(default_factory=dict)
    steps: int = Field(ge=0)
    # The checkpoint of the last step (the trainer always saves it): what the evaluator scores
    # last and what a job without evals registers. None only from older trainers.
    last_checkpoint_uri: str | None = None
    trained_tokens: int | None = Field(default=None, ge=0, description="non-pad tokens, all steps")


class FailedReport(_Report):
    """The attempt stopped without an artifact; fields of `JobFailed`."""

    kind: Literal["failed"] = "failed"
    reason: FailureReason
    message: str
    last_checkpoint_uri: str | None = None


TrainerReport = Annotated[
    StartedReport | ProgressReport | CheckpointSavedReport | CompletedReport | FailedReport,
    Field(discriminator="kind"),
]
REPORT_KINDS: tuple[str, ...] = (
    "started",
    "progress",
    "checkpoint_saved",
    "completed",
    "failed",
)
_ADAPTER: TypeAdapter[TrainerReport] = TypeAdapter(TrainerReport)


def _describe(exc: ValidationError) -> str:
    """One "field: message" per error, without the union tag pydantic puts first in each path."""
    lines = []
    for err in exc.errors():
        loc = err["loc"][1:] if err["loc"] and err["loc"][0] in REPORT_KINDS else err["loc"]
        lines.append(f"{error_path(loc) or 'body'}: {err['msg']}")
    return "; ".join(lines)


def parse_report(body: bytes | str) -> TrainerReport:
    """Parse a webhook body into its report class; ReportError says what is wrong and where."""
    try:
        return _ADAPTER.validate_json(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        if first["type"] == "json_invalid":
            raise ReportError(f"report body is not JSON: {first['msg']}") from None
        if first["type"] in ("union_tag_invalid", "union_tag_not_found"):
            got = first.get("ctx", {}).get("tag")
            raise ReportError(
                f"kind: must be one of {', '.join(REPORT_KINDS)}"
                + (f" (got {got!r})" if got is not None else " (missing)")
            ) from None
        raise ReportError(f"invalid {_kind_of(first)}report: {_describe(exc)}") from None


def _kind_of(error: Any) -> str:
    loc = error.get("loc") or ()
    return f"{loc[0]} " if loc and loc[0] in REPORT_KINDS else ""

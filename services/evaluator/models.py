"""Tables owned by the evaluator service: each job's plan and progress, its fixed eval subset, the
points scored (the base model and each checkpoint), every item's result, and the top checkpoints
re-scored on the whole eval split before the decision.

JSON parts (a prompt, a reference, an output, a grader's detail) are stored as bytes: they are
read whole and never filtered on. The base model's results sit under step BASE_STEP (-1), so one
results table serves every point.
"""

from datetime import datetime

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from shared.db import UTCDateTime, utcnow

BASE_STEP = -1


class EvalJobRow(SQLModel, table=True):
    """A job's plan (from job.planned), what training reported and where the evaluation stands."""

    __tablename__ = "evaluator_jobs"

    job_id: str = Field(primary_key=True, max_length=64)
    tenant: str = Field(max_length=63, index=True)
    base_model: str = Field(max_length=128)
    fine_tuned_model: str = Field(max_length=256)
    dataset_id: str = Field(max_length=64)
    dataset_version: str = Field(max_length=64)
    dataset_uri: str = Field(max_length=1024)
    task_kind: str = Field(max_length=16)
    steps: int
    eval_every: int
    eval_items: int
    auto_deploy: bool = False
    # Why this job cannot be evaluated (an unreadable eval split, the hoster refusing it): the
    # decision then takes the last checkpoint, rejected with this reason.
    eval_error: str | None = Field(default=None, max_length=2000)
    # Set once the engine was asked for; DELETEd after the decision (closed).
    engine_id: str | None = Field(default=None, max_length=128)
    base_score: float | None = None
    base_outputs_uri: str | None = Field(default=None, max_length=1024)
    base_published: bool = False
    # From job.training_completed: the decision waits for it.
    last_step: int | None = None
    last_checkpoint_uri: str | None = Field(default=None, max_length=1024)
    artifact_uri: str | None = Field(default=None, max_length=1024)
    # The decision (eval.decided) as published, JSON; published once stored.
    decision: bytes | None = Field(default=None, sa_type=sa.LargeBinary)
    decision_published: bool = False
    # The overfit stop (overfit.py): its reason once the rule held, stored before the request
    # (job.early_stop_requested) is published, once per job.
    early_stop_reason: str | None = Field(default=None, max_length=1000)
    early_stop_published: bool = False
    # The job ended (decided, failed or cancelled) and its engine was given back.
    closed: bool = False
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class EvalItemRow(SQLModel, table=True):
    """One item of a job's fixed eval subset: the prompt sent at every point and the reference."""

    __tablename__ = "evaluator_items"

    job_id: str = Field(primary_key=True, max_length=64)
    position: int = Field(primary_key=True)
    sample_id: str = Field(max_length=64)
    prompt: bytes = Field(sa_type=sa.LargeBinary)  # {"messages": [...], "tools": [...]}
    reference: bytes = Field(sa_type=sa.LargeBinary)  # {"text": str, "tool_calls": [[n, a]]}
    max_tokens: int


class EvalPointRow(SQLModel, table=True):
    """A checkpoint the trainer saved; scored when it is at the cadence (or the last step)."""

    __tablename__ = "evaluator_points"

    job_id: str = Field(primary_key=True, max_length=64)
    step: int = Field(primary_key=True)
    checkpoint_uri: str = Field(max_length=1024)
    score: float | None = None  # None: not scored (not due, or not yet)
    # The trainer's mean loss over the steps since the checkpoint before (job.checkpoint_saved).
    train_loss: float | None = None
    outputs_uri: str | None = Field(default=None, max_length=1024)
    duration_s: float | None = None
    # The best checkpoint moved to this point when it was scored (eval.best_checkpoint_changed).
    best_changed: bool = False
    published: bool = False
    received_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    scored_at: datetime | None = Field(default=None, sa_type=UTCDateTime)


class EvalResultRow(SQLModel, table=True):
    """One item's answer at one point (step BASE_STEP: the base model) and its grade."""

    __tablename__ = "evaluator_results"

    job_id: str = Field(primary_key=True, max_length=64)
    step: int = Field(primary_key=True)
    position: int = Field(primary_key=True)
    output: str = Field(sa_type=sa.Text)
    tool_calls: bytes = Field(sa_type=sa.LargeBinary)  # [[name, arguments], ...]
    score: float
    detail: bytes = Field(sa_type=sa.LargeBinary)
    latency_ms: float
    error: str | None = Field(default=None, max_length=2000)


class EvalRescoreRow(SQLModel, table=True):
    """A top checkpoint re-scored on the whole eval split before the decision: the mean over
    `items` items (the subset's answers and the rest's), and the rest's outputs as JSONL."""

    __tablename__ = "evaluator_rescores"

    job_id: str = Field(primary_key=True, max_length=64)
    step: int = Field(primary_key=True)
    score: float
    items: int
    outputs_uri: str = Field(max_length=1024)
    duration_s: float
    scored_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    # Whose scores: `judge` (a judged job the judge chooses for) or `deterministic` (every other
    # job, and a judged job whose choice fell back): a re-score of the other kind is redone.
    grader: str = Field(
        default="deterministic", max_length=16,
        sa_column_kwargs={"server_default": "deterministic"},
    )  # fmt: skip


class EvalServingRow(SQLModel, table=True):
    """The version serving an auto-deploying job's served name, scored on the items the job's
    best score was measured on (serving_baseline.py): its mean over `items` and its outputs as
    JSONL. One per (job, version): a restart that finds another version serving scores that."""

    __tablename__ = "evaluator_serving_baselines"

    job_id: str = Field(primary_key=True, max_length=64)
    version_id: str = Field(primary_key=True, max_length=64)
    version: int | None = None
    model: str = Field(max_length=256)
    checkpoint_uri: str = Field(max_length=1024)
    score: float
    items: int
    outputs_uri: str = Field(max_length=1024)
    duration_s: float
    scored_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


# --- the Evals API (OpenAI's shape: services/evaluator/evals/) ---------------------------------


class EvalsEvalRow(SQLModel, table=True):
    """An eval of the Evals API: its data source config and testing criteria, as accepted."""

    __tablename__ = "evaluator_evals"

    id: str = Field(primary_key=True, max_length=64)
    tenant: str = Field(max_length=63, index=True)
    name: str = Field(max_length=256)
    meta: bytes = Field(sa_type=sa.LargeBinary)  # the metadata, JSON ("metadata" is SQLModel's)
    # {item_schema, include_sample_schema} and [grader, ...], JSON.
    data_source_config: bytes = Field(sa_type=sa.LargeBinary)
    testing_criteria: bytes = Field(sa_type=sa.LargeBinary)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    updated_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class EvalsRunRow(SQLModel, table=True):
    """A run of an eval: its data source, where it stands and its counts so far."""

    __tablename__ = "evaluator_eval_runs"

    id: str = Field(primary_key=True, max_length=64)
    eval_id: str = Field(max_length=64, index=True)
    tenant: str = Field(max_length=63, index=True)
    name: str = Field(max_length=256)
    meta: bytes = Field(sa_type=sa.LargeBinary)
    data_source: bytes = Field(sa_type=sa.LargeBinary)  # as given (OpenAI's shape), JSON
    model: str | None = Field(default=None, max_length=256)
    status: str = Field(max_length=16)  # queued, in_progress, completed, failed, canceled
    error_code: str | None = Field(default=None, max_length=64)
    error_message: str | None = Field(default=None, max_length=2000)
    items: int
    passed: int = 0
    failed: int = 0
    errored: int = 0
    # Of the errored items, those the judge could not grade (judge_error).
    judge_errors: int = Field(default=0, sa_column_kwargs={"server_default": "0"})
    # {criterion name: [passed, failed]} and {model: usage counts}, JSON, added to per chunk.
    per_criteria: bytes = Field(sa_type=sa.LargeBinary)
    usage: bytes = Field(sa_type=sa.LargeBinary)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    finished_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    # The id (never the key) of the API key that started the run, and of the key this evaluator
    # minted to go on with it after a restart while it holds one (evals/resume.py).
    caller_key_id: str | None = Field(default=None, max_length=32)
    resume_key_id: str | None = Field(default=None, max_length=32)


class EvalsOutputItemRow(SQLModel, table=True):
    """One item of a run: the data source's item, its sample (given or generated) and grades."""

    __tablename__ = "evaluator_eval_output_items"

    run_id: str = Field(primary_key=True, max_length=64)
    position: int = Field(primary_key=True)
    id: str = Field(max_length=64, unique=True)
    item: bytes = Field(sa_type=sa.LargeBinary)
    sample: bytes | None = Field(default=None, sa_type=sa.LargeBinary)
    results: bytes | None = Field(default=None, sa_type=sa.LargeBinary)
    status: str = Field(max_length=8)  # pending, then pass, fail or error
    graded_at: datetime | None = Field(default=None, sa_type=UTCDateTime)


class JudgeRubricRow(SQLModel, table=True):
    """One version of a dataset version's rubric: generated by the judge, a default when it could
    not write one, or a user's edit (each edit is a new version; scores name the one they used)."""

    __tablename__ = "evaluator_judge_rubrics"

    tenant: str = Field(primary_key=True, max_length=63)
    dataset_version: str = Field(primary_key=True, max_length=64)
    version: int = Field(primary_key=True)
    source: str = Field(max_length=16)  # generated | default | user
    body: bytes = Field(sa_type=sa.LargeBinary)  # rubric.Rubric as JSON
    note: str | None = Field(default=None, max_length=2000)
    judge_model: str | None = Field(default=None, max_length=256)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class JudgeVerdictRow(SQLModel, table=True):
    """A judge's parsed verdict, keyed by sha256 of (tenant, rubric version, input, output, judge
    model): the same question is never asked twice. Failures are not kept."""

    __tablename__ = "evaluator_judge_verdicts"

    key: str = Field(primary_key=True, max_length=64)
    tenant: str = Field(max_length=63)
    model: str = Field(max_length=256)
    rubric: str = Field(max_length=128)
    verdict: bytes = Field(sa_type=sa.LargeBinary)  # {"value": ..., "assessment": ...}
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class JudgeJobRow(SQLModel, table=True):
    """A job graded by the judge (decided once, at its plan): its rubric's dataset version and
    the judge model."""

    __tablename__ = "evaluator_judge_jobs"

    job_id: str = Field(primary_key=True, max_length=64)
    tenant: str = Field(max_length=63)
    dataset_version: str = Field(max_length=64)
    model: str = Field(max_length=256)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class JudgeLabelRow(SQLModel, table=True):
    """A person's verdict on one answer (a job's item at one point): a score in [0, 1] or
    pass/fail (1/0). Calibration compares these with the judge's."""

    __tablename__ = "evaluator_judge_labels"

    job_id: str = Field(primary_key=True, max_length=64)
    step: int = Field(primary_key=True)
    position: int = Field(primary_key=True)
    tenant: str = Field(max_length=63)
    dataset_version: str = Field(max_length=64, index=True)
    kind: str = Field(max_length=16)  # score | pass_fail
    score: float
    note: str | None = Field(default=None, max_length=2000)
    updated_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class ShadowTargetRow(SQLModel, table=True):
    """A tenant's served name as the hoster last announced it (deployment.served_name_changed):
    its primary and, while it has one, its shadow, whose mirrored calls are scored (shadow.py)."""

    __tablename__ = "evaluator_shadow_targets"

    tenant: str = Field(primary_key=True, max_length=63)
    name: str = Field(primary_key=True, max_length=256)
    revision: int
    primary_version: str | None = Field(default=None, max_length=256)
    shadow_version: str | None = Field(default=None, max_length=256)
    # The shadow's ft: name (its job's rubric is looked up by it).
    shadow_model: str | None = Field(default=None, max_length=256)
    updated_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class ShadowCursorRow(SQLModel, table=True):
    """How far a tenant's shadow pairs have been read from ingest (its opaque cursor)."""

    __tablename__ = "evaluator_shadow_cursors"

    tenant: str = Field(primary_key=True, max_length=63)
    cursor: str = Field(max_length=512)
    updated_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class ShadowVerdictRow(SQLModel, table=True):
    """One shadow pair's outcome, stored once per pair: `shadow` / `primary` (the winner), `tie`,
    `judge_error` (counted apart, not decided), `shadow_failed` or `primary_failed` (not
    judged)."""

    __tablename__ = "evaluator_shadow_verdicts"
    __table_args__ = (
        sa.Index(
            "ix_evaluator_shadow_verdicts_score", "tenant", "name", "primary_version",
            "shadow_version",
        ),
    )  # fmt: skip

    tenant: str = Field(primary_key=True, max_length=63)
    pair_id: str = Field(primary_key=True, max_length=64)
    name: str = Field(max_length=256)
    primary_version: str = Field(max_length=256)
    shadow_version: str = Field(max_length=256)
    outcome: str = Field(max_length=16)
    # The judge's two answers as asked (shadow shown first, then primary first), JSON.
    verdicts: str | None = Field(default=None, max_length=64)
    error: str | None = Field(default=None, max_length=2000)
    rubric: str = Field(max_length=128)
    judge_model: str | None = Field(default=None, max_length=256)
    captured_at: datetime = Field(sa_type=UTCDateTime)
    judged_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)

"""What a dataset is built from and how: the body of `POST /v1/datasets`.

Every model forbids unknown fields, so a typo (`sorce`, `cleaning.max_token`) is a 422 naming it
instead of a silently ignored option.
"""

from __future__ import annotations

import re
from typing import Literal, NamedTuple, Self

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from services.ingest.gateway.purpose import PLATFORM_PREFIXES, SLUG_RULE, is_purpose
from services.ingest.gateway.purpose import TAG_PREFIX as PURPOSE_PREFIX
from services.ingest.samples.feedback.store import LABEL_MAX_LENGTH, LABEL_PATTERN, LABEL_RULE
from shared.catalogue import CATALOGUE, is_model_id
from shared.chat import Provider, Sample, Source

MetadataScalar = str | int | float | bool
STRATIFY_FIELDS = ("model", "source", "provider")
_LABEL = re.compile(LABEL_PATTERN)


class NewestFeedback(NamedTuple):
    """A sample's newest feedback label and newest feedback score (POST /v1/feedback), each
    from the newest feedback that has one; None where it has none."""

    label: str | None = None
    score: float | None = None


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SampleFilter(_Spec):
    """Which captured samples to take; every given criterion must match (AND), lists are OR
    within themselves except `tags`, which must all be present."""

    since: AwareDatetime | None = None
    until: AwareDatetime | None = None
    # Matches the answering model or the requested one (an alias like `gpt-4o` or its snapshot).
    models: list[str] = Field(default_factory=list)
    sources: list[Source] = Field(default_factory=list)
    providers: list[Provider] = Field(default_factory=list)
    tags: list[str] = Field(default_factory=list)
    metadata: dict[str, MetadataScalar] = Field(default_factory=dict)
    status: Literal["ok", "error"] | None = "ok"
    # The platform's own calls (a `purpose:<value>` tag: judge verdicts, shadow traffic, evals)
    # are left out unless their purpose is listed here (or named in `tags`).
    include_purposes: list[str] = Field(default_factory=list)
    # Feedback (POST /v1/feedback): samples whose newest feedback label is this one, or one of
    # these; whose newest feedback score is at least this. A sample without is not selected.
    feedback_label: list[str] = Field(default_factory=list)
    min_feedback_score: float | None = Field(default=None, allow_inf_nan=False)

    @field_validator("feedback_label", mode="before")
    @classmethod
    def _one_or_more_labels(cls, value: object) -> object:
        return [value] if isinstance(value, str) else value

    @field_validator("feedback_label")
    @classmethod
    def _labels(cls, value: list[str]) -> list[str]:
        for i, label in enumerate(value):
            if len(label) > LABEL_MAX_LENGTH or not _LABEL.fullmatch(label):
                raise ValueError(f"feedback_label[{i}]: {label[:40]!r} is not {LABEL_RULE}")
        return value

    @field_validator("include_purposes")
    @classmethod
    def _purposes(cls, value: list[str]) -> list[str]:
        for i, purpose in enumerate(value):
            if not is_purpose(purpose):
                raise ValueError(f"include_purposes[{i}]: {purpose[:40]!r} is not {SLUG_RULE}")
        return value

    def purpose_tags_kept(self) -> frozenset[str]:
        """The platform's tags (`purpose:`, `eval_run:`) a sample may carry and still be
        selected: the purposes included, and any such tag the filter names."""
        named = {tag for tag in self.tags if tag.startswith(PLATFORM_PREFIXES)}
        return frozenset({PURPOSE_PREFIX + p for p in self.include_purposes} | named)

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.since is not None and self.until is not None and self.since >= self.until:
            raise ValueError("source.since must be before source.until")
        return self

    def matches(self, sample: Sample, feedback: NewestFeedback | None = None) -> bool:
        """The reference semantics of the filter in Python (the store does the same in SQL).
        `feedback`: the sample's newest feedback (None: it has none)."""
        response = sample.response
        feedback = feedback or NewestFeedback()
        checks = (
            self.since is None or sample.created_at >= self.since,
            self.until is None or sample.created_at < self.until,
            not self.sources or sample.source in self.sources,
            not self.providers or (response is not None and response.provider in self.providers),
            not self.models
            or (
                response is not None
                and (response.model in self.models or response.model_requested in self.models)
            ),
            all(tag in sample.tags for tag in self.tags),
            all(
                tag in self.purpose_tags_kept()
                for tag in sample.tags
                if tag.startswith(PLATFORM_PREFIXES)
            ),
            all(_same_scalar(sample.metadata.get(k), v) for k, v in self.metadata.items()),
            self.status is None or (response.status if response else "ok") == self.status,
            not self.feedback_label or feedback.label in self.feedback_label,
            self.min_feedback_score is None
            or (feedback.score is not None and feedback.score >= self.min_feedback_score),
        )
        return all(checks)


def _same_scalar(got: object, want: MetadataScalar) -> bool:
    # True == 1 in Python; a metadata filter `{"vip": true}` must not match `{"vip": 1}`.
    return type(got) is type(want) and got == want


class CleaningOptions(_Spec):
    """Which cleaning steps run and how; defaults are the recommended ones."""

    drop_empty: bool = True
    # Counted in tokens of the base model's tokenizer (see DatasetSpec.base_model).
    max_tokens: int | None = Field(default=None, ge=1)
    overlong: Literal["drop", "truncate"] = "drop"
    dedup_exact: bool = True
    # Estimated Jaccard similarity of word 3-gram shingles; None turns near-dup removal off.
    near_dup_threshold: float | None = Field(default=0.9, gt=0.0, le=1.0)
    # n of the word n-grams compared between train and eval; None turns decontamination off.
    decontaminate_ngram: int | None = Field(default=13, ge=3, le=64)
    # An n-gram found in more train samples than this is boilerplate (a shared system prompt or
    # prompt template), not leaked eval content, and is ignored by decontamination.
    decontaminate_max_df: int = Field(default=10, ge=1)
    redact_pii: bool = True
    flag_refusals: bool = True
    flag_truncated: bool = True
    # Auto-on for a sample whose request asked for JSON (params.response_format).
    expect_json: bool = False
    keep_flagged: bool = False
    min_score: float | None = None
    # A numeric metadata value under this key, else the last tag `<score_key>:<number>`; with
    # the default key `score`, the sample's newest feedback score comes first.
    score_key: str = Field(default="score", min_length=1)


class SplitOptions(_Spec):
    """How the cleaned samples are split into train and eval."""

    # None: about 10% capped at 1,000; an int: that many; a float in (0, 1): that fraction.
    eval_size: int | float | None = None
    seed: int = 0
    # "model", "source", "provider", "tag:<prefix>" or "metadata.<key>".
    stratify_by: str | None = None

    @field_validator("eval_size", mode="before")
    @classmethod
    def _not_bool(cls, value: object) -> object:
        # pydantic would take `true` as the count 1.
        if isinstance(value, bool):
            raise ValueError("must be a count, a fraction in (0, 1) or null, not a boolean")
        return value

    @field_validator("eval_size")
    @classmethod
    def _eval_size(cls, value: int | float | None) -> int | float | None:
        if isinstance(value, int) and value < 0:
            raise ValueError("a count must be >= 0")
        if isinstance(value, float) and not 0.0 < value < 1.0:
            raise ValueError(f"a fraction must be in (0, 1), got {value}")
        return value

    @field_validator("stratify_by")
    @classmethod
    def _stratify_by(cls, value: str | None) -> str | None:
        if value is None or value in STRATIFY_FIELDS:
            return value
        for prefix in ("tag:", "metadata."):
            if value.startswith(prefix) and len(value) > len(prefix):
                return value
        raise ValueError(
            f"{value!r} is not a stratification key: use model, source, provider, "
            "tag:<prefix> or metadata.<key>"
        )


class DatasetSpec(_Spec):
    """A dataset build request: where samples come from, how they are cleaned and split.

    `source` and `file_ids` may both be given: the dataset is their union (deduplicated by
    sample id). At least one of them must select something. `eval_file_ids` (a fine-tuning
    job's `validation_file`) are the eval split exactly: no random split is made then.
    """

    name: str = Field(min_length=1, max_length=200)
    # The target base model: a base-model catalogue id (shared.catalogue) or an s3:// prefix
    # under the tenant's own storage (checked per tenant by the API); token counts and
    # max_tokens use its tokenizer. None: an approximate count (services.ingest.datasets.cleaning.tokens).
    base_model: str | None = Field(default=None, min_length=1)
    source: SampleFilter | None = None
    file_ids: list[str] = Field(default_factory=list)
    # Uploaded files whose samples are the eval split (cleaned like the rest); train is then
    # everything else selected, and split.eval_size must be unset or 0.
    eval_file_ids: list[str] = Field(default_factory=list)
    cleaning: CleaningOptions = Field(default_factory=CleaningOptions)
    split: SplitOptions = Field(default_factory=SplitOptions)

    @field_validator("base_model")
    @classmethod
    def _base_model(cls, value: str | None) -> str | None:
        if value is None or value.startswith("s3://") or is_model_id(value):
            return value
        raise ValueError(
            f"{value!r} is not a catalogue id ({', '.join(sorted(CATALOGUE))}) or an s3:// "
            "prefix: local paths are not accepted"
        )

    @field_validator("file_ids", "eval_file_ids")
    @classmethod
    def _file_ids(cls, value: list[str], info: ValidationInfo) -> list[str]:
        for i, file_id in enumerate(value):
            if not file_id.strip():
                raise ValueError(f"{info.field_name}[{i}] is empty")
        if len(set(value)) != len(value):
            raise ValueError(f"{info.field_name}: the same file is listed twice")
        return value

    @model_validator(mode="after")
    def _eval_files(self) -> Self:
        for i, file_id in enumerate(self.eval_file_ids):
            if file_id in self.file_ids:
                raise ValueError(
                    f"eval_file_ids[{i}]: {file_id!r} is also in file_ids; a file is either "
                    "training data or the eval split, not both"
                )
        if self.eval_file_ids and self.split.eval_size not in (None, 0):
            raise ValueError(
                f"split.eval_size: must be unset or 0 when eval_file_ids are given (their "
                f"samples are the eval split), got {self.split.eval_size}"
            )
        return self

    @model_validator(mode="after")
    def _has_input(self) -> Self:
        if self.source is None and not self.file_ids:
            raise ValueError(
                "source / file_ids: give a sample filter (source), uploaded file ids "
                "(file_ids), or both"
            )
        return self


def stratum_of(sample: Sample, stratify_by: str | None) -> str:
    """The stratum a sample falls in for `SplitOptions.stratify_by` ("" when unknown)."""
    if stratify_by is None:
        return ""
    response = sample.response
    if stratify_by == "model":
        return (response.model or response.model_requested or "") if response else ""
    if stratify_by == "provider":
        return response.provider if response else ""
    if stratify_by == "source":
        return sample.source
    if stratify_by.startswith("tag:"):
        prefix = stratify_by.removeprefix("tag:")
        return next((t for t in sorted(sample.tags) if t.startswith(prefix)), "")
    value = sample.metadata.get(stratify_by.removeprefix("metadata."))
    return "" if value is None else repr(value)


__all__ = [
    "CleaningOptions",
    "DatasetSpec",
    "NewestFeedback",
    "SampleFilter",
    "SplitOptions",
    "stratum_of",
]

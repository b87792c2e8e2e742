"""Request and response bodies of the Evals API, field for field as OpenAI's (the `openai` SDK's
`types/evals` parse them). Requests forbid unknown fields, so a typo is a 422 naming it.

Kinds tuneloop does not run (`logs` configs, `python` and `multi` graders, `responses` data
sources, `stored_completions` sources) are accepted by the schema and refused by serving.py with
a 422 that names them, rather than as an unreadable union mismatch.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

NAME_MAX = 256
TEMPLATE_MAX = 100_000


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _check_metadata(value: dict[str, str]) -> dict[str, str]:
    """OpenAI's rule: at most 16 pairs, keys up to 64 characters, values up to 512."""
    if len(value) > 16:
        raise ValueError(f"at most 16 key-value pairs, not {len(value)}")
    for key, item in value.items():
        if len(key) > 64:
            raise ValueError(f"key {key[:20]!r}...: at most 64 characters")
        if len(item) > 512:
            raise ValueError(f"value of {key!r}: at most 512 characters")
    return value


Metadata = Annotated[dict[str, str], AfterValidator(_check_metadata)]
Text = Annotated[str, Field(max_length=TEMPLATE_MAX)]
Name = Annotated[str, Field(min_length=1, max_length=NAME_MAX)]


# --- evals ------------------------------------------------------------------------------------


class CustomConfig(_Request):
    type: Literal["custom"]
    item_schema: dict[str, Any] = Field(description="the JSON schema every item must match")
    include_sample_schema: bool = Field(
        default=False, description="whether runs fill the `sample` namespace (a model answers)"
    )


class OtherConfig(BaseModel):
    """`logs` / `stored_completions`: OpenAI's stored traffic; refused (see serving.py)."""

    model_config = ConfigDict(extra="allow")
    type: Literal["logs", "stored_completions"]


class StringCheck(_Request):
    type: Literal["string_check"]
    name: Name
    input: Text
    reference: Text
    operation: Literal["eq", "ne", "like", "ilike"]


Metric = Literal[
    "cosine",
    "fuzzy_match",
    "bleu",
    "gleu",
    "meteor",
    "rouge_1",
    "rouge_2",
    "rouge_3",
    "rouge_4",
    "rouge_5",
    "rouge_l",
]


class TextSimilarity(_Request):
    type: Literal["text_similarity"]
    name: Name
    input: Text
    reference: Text
    evaluation_metric: Metric
    pass_threshold: float = Field(allow_inf_nan=False)


class ModelMessage(_Request):
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[dict[str, Any]] | dict[str, Any]
    type: Literal["message"] | None = None


class ScoreModel(_Request):
    type: Literal["score_model"]
    name: Name
    model: Name
    input: list[ModelMessage]
    range: list[float] | None = None
    sampling_params: dict[str, Any] | None = None
    pass_threshold: float | None = Field(default=None, allow_inf_nan=False)


class LabelModel(_Request):
    type: Literal["label_model"]
    name: Name
    model: Name
    input: list[ModelMessage]
    labels: list[str]
    passing_labels: list[str]


class OtherGrader(BaseModel):
    """`python` / `multi`: refused (tuneloop runs no user code)."""

    model_config = ConfigDict(extra="allow")
    type: Literal["python", "multi"]


Criterion = Annotated[
    StringCheck | TextSimilarity | ScoreModel | LabelModel | OtherGrader,
    Field(discriminator="type"),
]


class EvalCreate(_Request):
    data_source_config: Annotated[CustomConfig | OtherConfig, Field(discriminator="type")]
    testing_criteria: list[Criterion] = Field(min_length=1, max_length=32)
    name: Name | None = None
    metadata: Metadata | None = None


class EvalUpdate(_Request):
    name: Name | None = None
    metadata: Metadata | None = None


class Eval(BaseModel):
    id: str
    object: Literal["eval"] = "eval"
    created_at: int
    name: str
    metadata: dict[str, str] | None
    data_source_config: dict[str, Any] = Field(
        description="`{type: custom, schema}`: the JSON schema of `item` (and `sample`)"
    )
    testing_criteria: list[dict[str, Any]]


class EvalList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Eval]
    first_id: str | None
    last_id: str | None
    has_more: bool


class EvalDeleted(BaseModel):
    object: Literal["eval.deleted"] = "eval.deleted"
    deleted: bool
    eval_id: str


# --- runs -------------------------------------------------------------------------------------


class ContentRow(_Request):
    item: dict[str, Any]
    sample: dict[str, Any] | None = None


class FileContent(_Request):
    type: Literal["file_content"]
    content: list[ContentRow] = Field(min_length=1)


class FileId(_Request):
    type: Literal["file_id"]
    # `@<n>` only pins an eval set's version (sources.py); the id stays a safe path segment.
    id: Annotated[
        str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_-]+(@[0-9]+)?$")
    ] = Field(
        description="an uploaded file (`file-...`), a built dataset (`ds_...`: its eval split) or "
        "an eval set (`evs_...`: its latest version, `evs_...@<n>`: version n)"
    )


class OtherSource(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["stored_completions", "responses"]


Source = Annotated[FileContent | FileId | OtherSource, Field(discriminator="type")]


class JsonlDataSource(_Request):
    type: Literal["jsonl"]
    source: Source


class TemplateMessage(_Request):
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[dict[str, Any]]
    type: Literal["message"] | None = None


class Template(_Request):
    type: Literal["template"]
    template: list[TemplateMessage] = Field(min_length=1)


class ItemReference(_Request):
    type: Literal["item_reference"]
    item_reference: Annotated[str, Field(min_length=1, max_length=256)]


class SamplingParams(_Request):
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    seed: int | None = None
    max_completion_tokens: int | None = Field(default=None, ge=1)
    response_format: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    reasoning_effort: str | None = None


class CompletionsDataSource(_Request):
    type: Literal["completions"]
    source: Source
    model: Name | None = None
    input_messages: Annotated[Template | ItemReference, Field(discriminator="type")] | None = None
    sampling_params: SamplingParams | None = None


class OtherDataSource(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["responses"]


DataSource = Annotated[
    JsonlDataSource | CompletionsDataSource | OtherDataSource, Field(discriminator="type")
]


class RunCreate(_Request):
    data_source: DataSource
    name: Name | None = None
    metadata: Metadata | None = None


RunStatus = Literal["queued", "in_progress", "completed", "failed", "canceled"]


class ApiError(BaseModel):
    code: str
    message: str


class ResultCounts(BaseModel):
    total: int
    passed: int
    failed: int
    errored: int


class CriterionResult(BaseModel):
    testing_criteria: str
    passed: int
    failed: int


class ModelUsage(BaseModel):
    model_name: str
    invocation_count: int
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    cached_tokens: int


class Run(BaseModel):
    id: str
    object: Literal["eval.run"] = "eval.run"
    eval_id: str
    created_at: int
    name: str
    metadata: dict[str, str] | None
    model: str | None = Field(description="the model that answered (completions runs)")
    status: RunStatus
    data_source: dict[str, Any]
    error: ApiError | None
    result_counts: ResultCounts
    per_testing_criteria_results: list[CriterionResult]
    per_model_usage: list[ModelUsage]
    report_url: str | None = Field(description="always null: tuneloop renders no report page")
    judge_errors: int = Field(
        default=0,
        description="of result_counts.errored, the items a judge (score_model, label_model) "
        "could not grade: not OpenAI's field; a later run asks the judge again",
    )


class RunList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Run]
    first_id: str | None
    last_id: str | None
    has_more: bool


class RunDeleted(BaseModel):
    object: Literal["eval.run.deleted"] = "eval.run.deleted"
    deleted: bool
    run_id: str


class GraderResult(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str
    type: str
    score: float
    passed: bool
    sample: dict[str, Any] | None = None
    error: str | None = Field(default=None, description="why this grader could not grade")


class OutputItem(BaseModel):
    id: str
    object: Literal["eval.run.output_item"] = "eval.run.output_item"
    created_at: int
    run_id: str
    eval_id: str
    status: Literal["pass", "fail", "error"]
    datasource_item_id: int
    datasource_item: dict[str, Any]
    results: list[GraderResult]
    sample: dict[str, Any] | None


class OutputItemList(BaseModel):
    object: Literal["list"] = "list"
    data: list[OutputItem]
    first_id: str | None
    last_id: str | None
    has_more: bool

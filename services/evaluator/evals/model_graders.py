"""`score_model` and `label_model` criteria of the Evals API, graded by the LLM judge
(services/evaluator/judge.py: one retry quoting a reply that cannot be read, then a recorded
judge error; verdicts cached). The judge model is asked through the gateway with the caller's
key, like a run's own answers (generation.py), so it is any model the caller may call.

A result's `score` is the judge's score (in the grader's `range`), 1 or 0 for a label; `passed`
is the score at or above `pass_threshold` — without one, in the upper half of the range — or
the label being a passing one. `sample` holds the judge's written assessment.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError
from sqlalchemy.engine import Engine

from services.evaluator import judge
from services.evaluator.evals import graders, protocol
from services.evaluator.evals.errors import EvalsError
from services.evaluator.judge_records import DbVerdictCache

ModelGrader = judge.ScoreModelGrader | judge.LabelModelGrader
RESULT_TYPES = {"score_model": "score-model-grader", "label_model": "label-model-grader"}


def to_grader(criterion: protocol.ScoreModel | protocol.LabelModel, param: str) -> ModelGrader:
    """The judge's grader for a criterion; its rules broken (a label that is not among the
    labels, a threshold outside the range) are a 422 naming the field."""
    shape = judge.ScoreModelGrader if criterion.type == "score_model" else judge.LabelModelGrader
    try:
        return shape.model_validate(criterion.model_dump(exclude_none=True))
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join([param, *(str(p) for p in error["loc"])])
        message = str(error["msg"]).removeprefix("Value error, ")
        raise EvalsError(422, f"{where}: {message}", param=where) from None


def client(
    base_url: str, key: str, engine: Engine, *, concurrency: int, timeout_s: float
) -> judge.JudgeClient:
    # No x-tuneloop-purpose: the caller's key is not an internal one (generation.py).
    return judge.JudgeClient(
        base_url=base_url, api_key=key, purpose=None, concurrency=concurrency,
        timeout_s=timeout_s, cache=DbVerdictCache(engine),
    )  # fmt: skip


def _result(grader: ModelGrader, grade: judge.ModelGrade) -> dict[str, Any]:
    kind = RESULT_TYPES[grader.type]
    if grade.error is not None or grade.score is None:
        return graders.result(grader.name, kind, 0.0, False, error=f"judge_error: {grade.error}")
    sample = {"assessment": grade.assessment, "model": grader.model, "cached": grade.cached}
    if isinstance(grader, judge.ScoreModelGrader):
        value = float(grade.value) if isinstance(grade.value, int | float) else 0.0
        passed = grade.passed if grade.passed is not None else grade.score >= 0.5
        return graders.result(grader.name, kind, value, passed, sample=sample)
    sample["label"] = grade.value
    return graders.result(grader.name, kind, grade.score, bool(grade.passed), sample=sample)


async def grade(
    judge_client: judge.JudgeClient,
    grader: ModelGrader,
    *,
    tenant: str,
    item: Mapping[str, Any],
    sample: Mapping[str, Any],
) -> dict[str, Any]:
    found = await judge.grade(judge_client, grader, tenant=tenant, item=item, sample=sample)
    return _result(grader, found)

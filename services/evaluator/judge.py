"""The LLM judge: OpenAI's `score_model` and `label_model` grader shapes, asked of any
OpenAI-compatible endpoint (a frontier model through our gateway, or a deployed model) with the
official `openai` SDK.

Each question gets a verdict (a score or a label, and a written assessment) or a JudgeError,
never an exception and never a silent 0: a reply that cannot be read is asked once more,
quoting why, and a second bad reply (or the endpoint failing after the SDK's own retries) is a
JudgeError with the reason. Calls in flight are bounded (one semaphore per client, shared by
every job). Verdicts are cached by sha256 of (tenant, rubric version, input, output, model,
what was asked), so the same question is never paid for twice; failures are not cached.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Protocol

import openai
from pydantic import BaseModel, Field, model_validator

from services.evaluator.templating import TemplateError, render

PURPOSE_HEADER = "x-tuneloop-purpose"


# --- the graders' shapes (OpenAI's) --------------------------------------------------------------


class TextBlock(BaseModel):
    type: Literal["input_text", "output_text"] = "input_text"
    text: str


class GraderMessage(BaseModel):
    """One message of a grader's prompt; its text may hold `{{item.x}}` / `{{sample.x}}`."""

    role: Literal["system", "developer", "user", "assistant"]
    content: str | TextBlock | list[TextBlock]
    type: Literal["message"] | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        blocks = [self.content] if isinstance(self.content, TextBlock) else self.content
        return "\n".join(block.text for block in blocks)


class ScoreModelGrader(BaseModel):
    type: Literal["score_model"] = "score_model"
    name: str = Field(min_length=1, max_length=256)
    model: str = Field(min_length=1, max_length=256)
    input: list[GraderMessage] = Field(min_length=1)
    range: tuple[float, float] = (0.0, 1.0)
    pass_threshold: float | None = None
    sampling_params: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _range_holds_threshold(self) -> ScoreModelGrader:
        low, high = self.range
        if not low < high:
            raise ValueError(f"range: {list(self.range)} must be [low, high] with low < high")
        if self.pass_threshold is not None and not low <= self.pass_threshold <= high:
            raise ValueError(
                f"pass_threshold: {self.pass_threshold} is outside range {[low, high]}"
            )
        return self


class LabelModelGrader(BaseModel):
    type: Literal["label_model"] = "label_model"
    name: str = Field(min_length=1, max_length=256)
    model: str = Field(min_length=1, max_length=256)
    input: list[GraderMessage] = Field(min_length=1)
    labels: list[str] = Field(min_length=2)
    passing_labels: list[str] = Field(min_length=1)

    @model_validator(mode="after")
    def _passing_are_labels(self) -> LabelModelGrader:
        unknown = [label for label in self.passing_labels if label not in self.labels]
        if unknown:
            raise ValueError(f"passing_labels: {unknown} are not among labels {self.labels}")
        return self


ModelGrader = Annotated[ScoreModelGrader | LabelModelGrader, Field(discriminator="type")]


# --- reading a reply -----------------------------------------------------------------------------


class Unreadable(ValueError):
    """The judge's reply cannot be used; the message says why (it is quoted back on the retry)."""


_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)


def json_object(text: str) -> dict[str, Any]:
    """The first JSON object in the reply: the whole reply, a ```json fence, or one embedded in
    prose (small models add words around it)."""
    candidates = [text.strip(), *(m.group(1).strip() for m in _FENCE.finditer(text))]
    for candidate in candidates:
        try:
            value = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    decoder = json.JSONDecoder()
    for start in (i for i, c in enumerate(text) if c == "{"):
        try:
            value, _ = decoder.raw_decode(text, start)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    raise Unreadable("the reply holds no JSON object")


def _assessment(obj: dict[str, Any]) -> str:
    assessment = obj.get("assessment")
    if not isinstance(assessment, str) or not assessment.strip():
        raise Unreadable('"assessment": missing; write one or two sentences on why')
    return assessment.strip()


def read_score(text: str, low: float, high: float) -> tuple[float, str]:
    obj = json_object(text)
    score = obj.get("score")
    if isinstance(score, str):
        with contextlib.suppress(ValueError):
            score = float(score.strip())
    if isinstance(score, bool) or not isinstance(score, int | float):
        raise Unreadable(f'"score": {score!r} is not a number from {low:g} to {high:g}')
    if not low <= float(score) <= high:
        raise Unreadable(f'"score": {score!r} is outside the range {low:g} to {high:g}')
    return float(score), _assessment(obj)


def read_label(text: str, labels: list[str]) -> tuple[str, str]:
    obj = json_object(text)
    label = obj.get("label")
    if not isinstance(label, str) or label.strip() not in labels:
        raise Unreadable(f'"label": {label!r} is not one of {json.dumps(labels)}')
    return label.strip(), _assessment(obj)


# --- outcomes and the cache ----------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    value: float | str  # a score in the grader's range, a label, or a pairwise winner
    assessment: str
    model: str
    attempts: int  # 0: from the cache
    cached: bool = False


@dataclass(frozen=True)
class JudgeError:
    error: str
    attempts: int


Outcome = Verdict | JudgeError
Reader = Callable[[str], tuple[float | str, str]]


class VerdictCache(Protocol):
    """Blocking store of verdicts (the judge calls it in a thread)."""

    def get(self, key: str) -> dict[str, Any] | None: ...

    def put(
        self, key: str, *, tenant: str, model: str, rubric: str, verdict: dict[str, Any]
    ) -> None: ...


def cache_key(
    *, tenant: str, rubric: str, messages: list[dict[str, str]], output: str, model: str, asked: str
) -> str:
    """sha256 of what decides a verdict: the rubric version, the input (the rendered prompt), the
    output judged, the model, and what was asked (a score range, a label set)."""
    parts = [tenant, rubric, messages, output, model, asked]
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


# --- the client ----------------------------------------------------------------------------------

RETRY = (
    "Your reply could not be used: {error}. Reply again with only the JSON object asked for, "
    "nothing before or after it."
)


def _describe(exc: openai.APIError) -> str:
    if isinstance(exc, openai.APITimeoutError):
        return "timed out"
    if isinstance(exc, openai.APIStatusError):
        return f"answered {exc.status_code}: {exc.message}"[:500]
    return f"{type(exc).__name__}: {exc}"[:500]


class JudgeClient:
    def __init__(
        self,
        *,
        base_url: str,
        api_key: str,
        purpose: str | None = "judge",
        concurrency: int = 4,
        timeout_s: float = 120.0,
        max_retries: int = 2,
        max_tokens: int = 400,
        cache: VerdictCache | None = None,
    ) -> None:
        headers = {PURPOSE_HEADER: purpose} if purpose else None
        self._client = openai.AsyncOpenAI(
            base_url=base_url,
            api_key=api_key,
            timeout=timeout_s,
            max_retries=max_retries,
            default_headers=headers,
        )
        self._gate = asyncio.Semaphore(concurrency)
        self.max_tokens, self.cache = max_tokens, cache

    async def aclose(self) -> None:
        await self._client.close()

    async def complete(
        self, model: str, messages: list[dict[str, str]], sampling: Mapping[str, Any] | None = None
    ) -> str:
        """One reply's text; openai.APIError when the endpoint fails (after the SDK's retries)."""
        params: dict[str, Any] = {"temperature": 0, "max_tokens": self.max_tokens}
        for name, value in (sampling or {}).items():
            if value is not None and name in ("temperature", "top_p", "seed"):
                params[name] = value
            elif value is not None and name == "max_completions_tokens":
                params["max_tokens"] = value
        async with self._gate:
            completion = await self._client.chat.completions.create(
                model=model,
                messages=messages,  # type: ignore[arg-type]  # plain role/content dicts
                **params,
            )
        return (completion.choices[0].message.content or "") if completion.choices else ""

    async def ask(
        self,
        *,
        model: str,
        messages: list[dict[str, str]],
        read: Reader,
        key: str | None = None,
        tenant: str = "",
        rubric: str = "",
        sampling: Mapping[str, Any] | None = None,
    ) -> Outcome:
        """A verdict (from the cache when `key` is there), or a JudgeError saying why not."""
        if key is not None and self.cache is not None:
            hit = await asyncio.to_thread(self.cache.get, key)
            if hit is not None:
                return Verdict(hit["value"], hit["assessment"], model, attempts=0, cached=True)
        conversation = list(messages)
        for attempt in (1, 2):
            try:
                reply = await self.complete(model, conversation, sampling)
            except openai.APIError as exc:
                return JudgeError(f"judge endpoint: {_describe(exc)}", attempt)
            try:
                value, assessment = read(reply)
            except Unreadable as exc:
                if attempt == 2:
                    return JudgeError(f"unreadable twice: {exc} (reply: {reply[:300]!r})", 2)
                retry = RETRY.format(error=exc)
                conversation += [
                    {"role": "assistant", "content": reply},
                    {"role": "user", "content": retry},
                ]
                continue
            verdict = Verdict(value, assessment, model, attempts=attempt)
            if key is not None and self.cache is not None:
                stored = {"value": value, "assessment": assessment}
                await asyncio.to_thread(
                    self.cache.put, key, tenant=tenant, model=model, rubric=rubric, verdict=stored
                )
            return verdict
        raise AssertionError("unreachable: the loop returns on its second attempt")


# --- a grader applied to one item ----------------------------------------------------------------


@dataclass(frozen=True)
class ModelGrade:
    """A model grader's result for one item: `score` in [0, 1] (the raw score scaled from the
    grader's range, or 1/0 for a passing/failing label), None with `error` on a judge_error."""

    grader: str
    score: float | None
    value: float | str | None
    passed: bool | None
    assessment: str
    error: str | None = None
    cached: bool = False
    attempts: int = 0


def _format(grader: ScoreModelGrader | LabelModelGrader) -> tuple[str, Reader, str]:
    """The reply format asked for, its reader, and what was asked (part of the cache key)."""
    if isinstance(grader, ScoreModelGrader):
        low, high = grader.range

        def score(text: str) -> tuple[float | str, str]:
            return read_score(text, low, high)

        shape = f'{{"score": <a number from {low:g} to {high:g}>, "assessment": "<why>"}}'
        return shape, score, f"score:{low:g}:{high:g}"
    labels = grader.labels

    def label(text: str) -> tuple[float | str, str]:
        return read_label(text, labels)

    shape = f'{{"label": <one of {json.dumps(labels)}>, "assessment": "<why>"}}'
    return shape, label, "label:" + json.dumps(labels)


def prompt(
    grader: ScoreModelGrader | LabelModelGrader,
    *,
    item: Mapping[str, Any],
    sample: Mapping[str, Any],
) -> list[dict[str, str]]:
    """The grader's messages rendered, and the reply format asked for last. TemplateError when
    a `{{...}}` names what the item or the sample does not have."""
    shape, _, _ = _format(grader)
    messages = [
        {"role": m.role, "content": render(m.text(), {"item": item, "sample": sample})}
        for m in grader.input
    ]
    ask = f"Reply with only a JSON object, nothing before or after it: {shape}"
    return [*messages, {"role": "user", "content": ask}]


async def grade(
    client: JudgeClient,
    grader: ScoreModelGrader | LabelModelGrader,
    *,
    tenant: str,
    item: Mapping[str, Any],
    sample: Mapping[str, Any],
    rubric: str = "",
) -> ModelGrade:
    """Ask the judge to grade one item (cached per `rubric` version); a judge_error is a
    ModelGrade with `error` and no score."""
    try:
        messages = prompt(grader, item=item, sample=sample)
    except TemplateError as exc:
        return ModelGrade(grader.name, None, None, None, "", error=f"template: {exc}")
    _, read, asked = _format(grader)
    output = json.dumps(dict(sample), sort_keys=True, default=str)
    key = cache_key(
        tenant=tenant, rubric=rubric, messages=messages, output=output, model=grader.model,
        asked=asked,
    )  # fmt: skip
    sampling = grader.sampling_params if isinstance(grader, ScoreModelGrader) else None
    outcome = await client.ask(
        model=grader.model, messages=messages, read=read, key=key, tenant=tenant, rubric=rubric,
        sampling=sampling,
    )  # fmt: skip
    if isinstance(outcome, JudgeError):
        return ModelGrade(
            grader.name, None, None, None, "", outcome.error, attempts=outcome.attempts
        )
    if isinstance(grader, ScoreModelGrader):
        low, high = grader.range
        raw = float(outcome.value)
        threshold = grader.pass_threshold
        passed = None if threshold is None else raw >= threshold
        scaled = (raw - low) / (high - low)
    else:
        passed = outcome.value in grader.passing_labels
        scaled = 1.0 if passed else 0.0
    return ModelGrade(
        grader.name,
        scaled,
        outcome.value,
        passed,
        outcome.assessment,
        cached=outcome.cached,
        attempts=outcome.attempts,
    )

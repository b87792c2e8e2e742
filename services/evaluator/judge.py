"""The LLM judge: OpenAI's `score_model` and `label_model` grader shapes, asked of any
OpenAI-compatible endpoint (a frontier model through our gateway, or a deployed model) with the
official `openai` SDK.

Each question gets a verdict (a score or a label, and a written assessment) or a JudgeError,
never an exception and never a silent 0: a reply that cannot be read is asked once more,
quoting why, and a second bad reply is a JudgeError with the reason. A call that failed for a
reason that passes (the connection, a timeout, 408/409/429, a 5xx) is made again after a
backoff (`max_retries` times, each wait doubling from `backoff_s` up to `max_backoff_s`, or the
endpoint's Retry-After within that bound) before it is a JudgeError; a refusal (400, 401, 404)
is one at once. Calls in flight are bounded (one semaphore per client, shared by every job; a
call waiting out its backoff holds no place). Verdicts are cached by sha256 of (tenant, rubric
version, input, output, model, what was asked), so the same question is never paid for twice;
failures are not cached, so the next question about the same answer asks the judge again.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Protocol

import openai
from pydantic import BaseModel, Field, model_validator
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt

from services.evaluator.judge_replies import Unreadable, read_label, read_score
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


# What another try may fix, as the openai SDK's own retry rule: a dropped connection or a
# timeout, a request timeout or lock conflict, a rate limit, a server error.
_PASSING = frozenset({408, 409, 429})


def transient(exc: BaseException) -> bool:
    if isinstance(exc, openai.APIConnectionError):  # APITimeoutError is one
        return True
    return isinstance(exc, openai.APIStatusError) and (
        exc.status_code in _PASSING or exc.status_code >= 500
    )


def _retry_after(exc: BaseException | None) -> float | None:
    """The seconds a 429 or 503 asks to wait (`Retry-After` in seconds), if it says."""
    response = getattr(exc, "response", None)
    value = response.headers.get("retry-after") if response is not None else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None  # an HTTP date: the backoff decides


class EndpointFailed(Exception):
    """The judge endpoint failed on every try; `tries` calls were made."""

    def __init__(self, cause: openai.APIError, tries: int) -> None:
        after = f" ({tries} tries)" if tries > 1 else ""
        super().__init__(f"judge endpoint: {_describe(cause)}{after}")
        self.tries = tries


class JudgeClient:
    def __init__(
        self,
        *,
        base_url: str,
        api_key: str,
        purpose: str | None = "judge",
        concurrency: int = 4,
        timeout_s: float = 120.0,
        max_retries: int = 3,
        backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
        max_tokens: int = 400,
        cache: VerdictCache | None = None,
    ) -> None:
        headers = {PURPOSE_HEADER: purpose} if purpose else None
        # The SDK retries nothing: the backoff below is the one rule, counted and bounded.
        self._client = openai.AsyncOpenAI(
            base_url=base_url,
            api_key=api_key,
            timeout=timeout_s,
            max_retries=0,
            default_headers=headers,
        )
        self._gate = asyncio.Semaphore(concurrency)
        self.max_tokens, self.cache = max_tokens, cache
        self.max_retries, self.backoff_s, self.max_backoff_s = max_retries, backoff_s, max_backoff_s

    async def aclose(self) -> None:
        await self._client.close()

    def _wait(self, state: RetryCallState) -> float:
        """Before try n + 1: backoff_s x 2^(n-1) (jittered to 75-100 %, so calls that failed
        together do not return together), or what Retry-After asks; at most max_backoff_s."""
        failed = state.outcome.exception() if state.outcome is not None else None
        jitter = random.uniform(0.75, 1.0)  # noqa: S311  # spreading retries, not a secret
        backoff: float = self.backoff_s * 2 ** (state.attempt_number - 1) * jitter
        asked = _retry_after(failed)
        return min(self.max_backoff_s, max(backoff, asked or 0.0))

    async def complete(
        self, model: str, messages: list[dict[str, str]], sampling: Mapping[str, Any] | None = None
    ) -> str:
        """One reply's text; EndpointFailed when the endpoint fails for good (a refusal at
        once; a transient failure after `max_retries` more tries)."""
        params: dict[str, Any] = {"temperature": 0, "max_tokens": self.max_tokens}
        for name, value in (sampling or {}).items():
            if value is not None and name in ("temperature", "top_p", "seed"):
                params[name] = value
            elif value is not None and name == "max_completions_tokens":
                params["max_tokens"] = value
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.max_retries + 1),
            wait=self._wait,
            retry=retry_if_exception(transient),
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    return await self._call(model, messages, params)
        except openai.APIError as exc:
            raise EndpointFailed(exc, retrying.statistics.get("attempt_number", 1)) from exc
        raise AssertionError("unreachable: AsyncRetrying returns or raises")

    async def _call(
        self, model: str, messages: list[dict[str, str]], params: dict[str, Any]
    ) -> str:
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
            except EndpointFailed as exc:
                return JudgeError(str(exc), attempt)
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

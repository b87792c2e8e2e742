"""A dataset version's rubric and the judge's prompt built on it.

The rubric (criteria, what a low and a high score look like, scored examples) is written once
per dataset version by the judge model from a sample of the job's eval items; when the judge
cannot write a readable one, a default template built from the same sample stands in, saying
why. The user may edit it (judge_records stores each edit as a new version). Answers are scored
0-10 against it, with the item's reference answer beside them: a reference and a rubric built
from the data are what keep an LLM judge close to people (KNOWLEDGE.md).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from services.evaluator.graders import Answer
from services.evaluator.judge import GraderMessage, JudgeClient, JudgeError, ScoreModelGrader
from services.evaluator.judge_replies import Unreadable, json_object
from services.evaluator.subset import EvalItem

SCALE = (0.0, 10.0)
PASS_THRESHOLD = 7.0  # "acceptable" on the 0-10 scale: labels' pass/fail and exact agreement
_CLIP_INPUT, _CLIP_ANSWER = 1200, 800
Criterion = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=500)]


class RubricExample(BaseModel):
    model_config = ConfigDict(extra="ignore")

    input: str = Field(max_length=4000)
    answer: str = Field(max_length=4000)
    score: float = Field(ge=SCALE[0], le=SCALE[1])
    why: str = Field(default="", max_length=1000)


class Rubric(BaseModel):
    """What the judge grades by; also the body of `PUT /v1/evals/rubrics/{dataset_version}`."""

    model_config = ConfigDict(extra="forbid")

    criteria: list[Criterion] = Field(min_length=1, max_length=12)
    low: str = Field(min_length=1, max_length=1000, description="what a 0-3 answer looks like")
    high: str = Field(min_length=1, max_length=1000, description="what an 8-10 answer looks like")
    examples: list[RubricExample] = Field(default_factory=list, max_length=8)

    def text(self) -> str:
        lines = ["Criteria:"]
        lines += [f"{n}. {c}" for n, c in enumerate(self.criteria, start=1)]
        lines += [f"A low score (0-3): {self.low}", f"A high score (8-10): {self.high}"]
        if self.examples:
            lines.append("Examples:")
        for example in self.examples:
            lines.append(
                f"- Input: {example.input}\n  Answer: {example.answer}\n"
                f"  Score: {example.score:g}. {example.why}".rstrip()
            )
        return "\n".join(lines)


def clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def answer_text(answer: Answer) -> str:
    calls = [f"[tool call] {name}({arguments})" for name, arguments in answer.tool_calls]
    return "\n".join([answer.text, *calls]).strip()


def conversation_text(messages: list[dict[str, Any]]) -> str:
    lines = []
    for message in messages:
        content = message.get("content")
        text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
        calls = message.get("tool_calls") or []
        if calls:
            text = f"{text or ''} {json.dumps(calls, ensure_ascii=False)}".strip()
        lines.append(f"{message.get('role', 'user')}: {text}")
    return "\n".join(lines)


# --- the judge's prompt --------------------------------------------------------------------------

JUDGE_SYSTEM = (
    "You grade one answer a model gave, from 0 (useless) to 10 (as good as the reference), by "
    "the rubric below. A reference answer is given: an answer that says the same in other words "
    "scores as high as it.\n\n{{item.rubric}}"
)
JUDGE_USER = (
    "The conversation:\n{{item.input}}\n\nThe reference answer:\n{{item.reference}}\n\n"
    "The answer to grade:\n{{sample.output_text}}"
)


def task_grader(model: str) -> ScoreModelGrader:
    """The mid-run judge as a score_model grader: the rubric and the reference in the prompt."""
    return ScoreModelGrader(
        name="rubric judge",
        model=model,
        input=[
            GraderMessage(role="system", content=JUDGE_SYSTEM),
            GraderMessage(role="user", content=JUDGE_USER),
        ],
        range=SCALE,
        pass_threshold=PASS_THRESHOLD,
    )


def item_namespace(item: EvalItem, rubric: Rubric) -> dict[str, Any]:
    return {
        "input": conversation_text(item.messages),
        "reference": answer_text(item.reference),
        "rubric": rubric.text(),
        "sample_id": item.sample_id,
    }


def sample_namespace(answer: Answer) -> dict[str, Any]:
    return {"output_text": answer_text(answer)}


# --- writing one ---------------------------------------------------------------------------------

WRITER_SYSTEM = "You write grading rubrics for judging a model's answers on one task."
_CRITERIA, _LOW, _HIGH = (
    "3 to 6 short criteria",
    "what a 0-3 answer looks like",
    "what an 8-10 answer looks like",
)
WRITER_ASK = (
    "Below are examples of the task: each an input and its ideal answer. Write a rubric for "
    "scoring answers to this task from 0 to 10. Reply with only a JSON object: "
    f'{{"criteria": ["{_CRITERIA}"], "low": "{_LOW}", "high": "{_HIGH}", "examples": '
    '[{"input": "...", "answer": "...", "score": 0, "why": "..."}]} with 2 to 4 examples, at '
    "least one low and one high."
)


WRITER_MAX_TOKENS = 1200  # a rubric with four examples; a verdict needs far fewer


def writer_prompt(items: list[EvalItem]) -> list[dict[str, str]]:
    parts = [
        f"### Example {n}\nInput:\n{clip(conversation_text(item.messages), _CLIP_INPUT)}\n"
        f"Ideal answer:\n{clip(answer_text(item.reference), _CLIP_ANSWER)}"
        for n, item in enumerate(items, start=1)
    ]
    user = "\n\n".join([WRITER_ASK, *parts, WRITER_ASK])
    return [{"role": "system", "content": WRITER_SYSTEM}, {"role": "user", "content": user}]


def read_rubric(text: str) -> tuple[float | str, str]:
    """The rubric as JSON text (the judge's reader shape); a malformed or placeholder example is
    dropped; a malformed criterion, low or high, or the format's placeholders copied back, is
    Unreadable naming why."""
    obj = json_object(text)
    examples = obj.get("examples") if isinstance(obj.get("examples"), list) else []
    kept = []
    for example in examples or []:
        try:
            checked = RubricExample.model_validate(example)
        except ValidationError:
            continue
        if "..." not in (checked.input.strip(), checked.answer.strip()):
            kept.append(checked)
    body = {k: obj.get(k) for k in ("criteria", "low", "high")} | {"examples": kept[:8]}
    try:
        rubric = Rubric.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise Unreadable(f'"{where}": {first["msg"]}') from None
    if {_CRITERIA, _LOW, _HIGH} & {*rubric.criteria, rubric.low, rubric.high}:
        # A small model copies the format it was shown rather than writing a rubric.
        raise Unreadable("the reply repeats the format's placeholders instead of a rubric")
    return rubric.model_dump_json(), "written"


def default_rubric(items: list[EvalItem]) -> Rubric:
    """The template that stands in when the judge cannot write a rubric: the dataset's own
    answers as the examples of a high score."""
    examples = [
        RubricExample(
            input=clip(conversation_text(item.messages), _CLIP_INPUT),
            answer=clip(answer_text(item.reference), _CLIP_ANSWER),
            score=10,
            why="the dataset's own answer",
        )
        for item in items[:2]
    ]
    return Rubric(
        criteria=[
            "Says what the reference answer says: the same facts, decisions or values",
            "Complete: nothing the reference covers is missing",
            "Invents nothing the conversation does not support",
            "Has the form of the reference: format, length and tone",
        ],
        low="wrong, empty, off the subject, or contradicts the reference",
        high="says the same as the reference, in its form, possibly in other words",
        examples=examples,
    )


async def write(
    client: JudgeClient, *, model: str, items: list[EvalItem], max_tokens: int = WRITER_MAX_TOKENS
) -> tuple[Rubric, str, str | None]:
    """(rubric, source, note): `generated` by the judge, or `default` with why it is not."""
    outcome = await client.ask(
        model=model,
        messages=writer_prompt(items),
        read=read_rubric,
        sampling={"max_completions_tokens": max_tokens},
    )
    if isinstance(outcome, JudgeError):
        note = f"the judge could not write a rubric ({outcome.error}); the default template"
        return default_rubric(items), "default", note[:2000]
    return Rubric.model_validate_json(str(outcome.value)), "generated", None

"""What the recipe needs to know of a dataset: its size, example lengths and the kind of task.

Token lengths come from the dataset snapshot's stats (the builder counted them in the base
model's tokenizer); the task kind from the training samples' final assistant turns, which this
module reads without a tokenizer, so the scheduler never loads a model to plan a job.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from shared.chat import Sample
from shared.tasks import TaskKind

# Shares of the final assistant turns that decide the kind (see `task_kind`).
JSON_SHARE = 0.8
TOOL_SHARE = 0.3
# A "short label" answer: at most this many tokens at the 90th percentile, from a small set.
LABEL_MAX_TOKENS = 8
LABEL_MAX_DISTINCT = 50


@dataclass(frozen=True)
class Lengths:
    p50: int
    p90: int
    p99: int
    max: int

    @classmethod
    def of(cls, stats: Mapping[str, Any]) -> Lengths:
        return cls(*(int(stats.get(key, 0)) for key in ("p50", "p90", "p99", "max")))


@dataclass(frozen=True)
class DatasetProfile:
    """The facts the recipe decides from. `example` lengths are prompt + completion tokens."""

    n_train: int
    n_eval: int
    example: Lengths
    completion: Lengths
    json_share: float  # final assistant turns that are one JSON object
    tool_share: float  # samples whose assistant turns call tools
    distinct_answers: int  # distinct final assistant texts
    # The final answers' own tokens, without the chat template's tokens around a turn that
    # `completion` counts; None for a snapshot whose stats predate it (completion is used).
    answer: Lengths | None = None

    @property
    def answer_p90(self) -> int:
        return (self.answer or self.completion).p90

    @property
    def task_kind(self) -> TaskKind:
        return task_kind(self)[0]


def task_kind(profile: DatasetProfile) -> tuple[TaskKind, str]:
    """The task kind and the rule that chose it, tools first: a tool-calling agent's answers
    are judged on its calls even when some turns are JSON."""
    if profile.tool_share >= TOOL_SHARE:
        return "tool_calls", f"{profile.tool_share:.0%} of samples call tools (>= {TOOL_SHARE:.0%})"
    if profile.json_share >= JSON_SHARE:
        return (
            "json",
            f"{profile.json_share:.0%} of answers are one JSON object (>= {JSON_SHARE:.0%})",
        )
    if profile.answer_p90 <= LABEL_MAX_TOKENS and profile.distinct_answers <= LABEL_MAX_DISTINCT:
        return "short_label", (
            f"answers are short (p90 {profile.answer_p90} <= {LABEL_MAX_TOKENS} tokens) "
            f"from {profile.distinct_answers} distinct values (<= {LABEL_MAX_DISTINCT})"
        )
    return "free_text", "answers are neither JSON objects, tool calls nor short labels"


def final_answer(sample: Sample) -> str | None:
    """The text of the sample's last assistant turn (what the model learns to say), or None."""
    for message in reversed(sample.messages):
        if message.role == "assistant":
            return message.text()
    return None


def is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def profile_dataset(
    stats: Mapping[str, Any], train: Iterable[Sample], *, n_eval: int | None = None
) -> DatasetProfile:
    """A profile from a snapshot's `stats` (dataset.json) and its training samples."""
    split = stats.get("train", {})
    tokens = split.get("tokens", {})
    prompt, completion = (
        Lengths.of(tokens.get("prompt", {})),
        Lengths.of(tokens.get("completion", {})),
    )
    answers: list[str] = []
    calling = 0
    for sample in train:
        answer = final_answer(sample)
        if answer is not None:
            answers.append(answer.strip())
        calling += any(m.tool_calls for m in sample.messages if m.role == "assistant")
    n_train = int(split.get("count", len(answers)))
    counted = max(len(answers), 1)
    return DatasetProfile(
        n_train=n_train,
        n_eval=n_eval if n_eval is not None else int(stats.get("eval", {}).get("count", 0)),
        # The sum of two percentiles bounds the percentile of the sums from above: rows sized by
        # it never cut an example at that percentile.
        example=Lengths(
            *(a + b for a, b in zip(_fields(prompt), _fields(completion), strict=True))
        ),
        completion=completion,
        json_share=sum(map(is_json_object, answers)) / counted,
        tool_share=calling / max(n_train, 1),
        distinct_answers=len(set(answers)),
        answer=Lengths.of(tokens["answer"]) if "answer" in tokens else None,
    )


def _fields(lengths: Lengths) -> tuple[int, int, int, int]:
    return lengths.p50, lengths.p90, lengths.p99, lengths.max

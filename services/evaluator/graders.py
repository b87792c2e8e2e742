"""Deterministic graders: a reference answer and a model's answer in, a score in [0, 1] out.

One grader a task kind (shared.tasks): per-field match of a JSON object, exact match of a short
label, ROUGE-L for free text, tool-call name and arguments. They run in the evaluator's process
on every eval item, so they import nothing heavy. ROUGE-L is the textbook LCS F-measure over
lower-cased word tokens, written here (15 lines) rather than pulling `rouge-score` and its nltk
dependency into a service that otherwise imports no ML library.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from shared.tasks import TaskKind


@dataclass(frozen=True)
class Answer:
    """What a model said: its text and the tool calls it made (name, arguments as JSON text)."""

    text: str = ""
    tool_calls: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Grade:
    score: float
    detail: dict[str, Any] = field(default_factory=dict)


Grader = Callable[[Answer, Answer], Grade]

_FENCE = re.compile(r"^\s*```(?:json)?\s*(.*?)\s*```\s*$", re.DOTALL)


def _json_object(text: str) -> dict[str, Any] | None:
    """The answer as one JSON object; a ```json fence around it is forgiven (models add them)."""
    fenced = _FENCE.match(text)
    try:
        value = json.loads(fenced.group(1) if fenced else text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _same(expected: Any, got: Any) -> bool:
    if isinstance(expected, str) and isinstance(got, str):
        return expected.strip().casefold() == got.strip().casefold()
    if isinstance(expected, bool) or isinstance(got, bool):
        return expected is got
    if isinstance(expected, int | float) and isinstance(got, int | float):
        return float(expected) == float(got)
    return bool(expected == got)


def json_fields(reference: Answer, answer: Answer) -> Grade:
    """The share of the reference's fields the answer matches; an answer that is not one JSON
    object scores 0. Strings match case- and edge-space-insensitively, numbers by value."""
    expected = _json_object(reference.text)
    if expected is None:
        raise ValueError("reference: not a JSON object, so the json grader does not apply")
    got = _json_object(answer.text)
    if got is None:
        return Grade(0.0, {"valid_json": False})
    if not expected:
        return Grade(1.0 if not got else 0.0, {"valid_json": True})
    wrong = sorted(k for k, v in expected.items() if k not in got or not _same(v, got[k]))
    extra = sorted(set(got) - set(expected))
    score = (len(expected) - len(wrong)) / len(expected)
    return Grade(score, {"valid_json": True, "wrong_fields": wrong, "extra_fields": extra})


def _normalise(text: str) -> str:
    return " ".join(text.split()).strip(" .!").casefold()


def exact_label(reference: Answer, answer: Answer) -> Grade:
    """1 when the answer is the reference label (case, spacing and a final full stop aside)."""
    return Grade(float(_normalise(reference.text) == _normalise(answer.text)))


_WORD = re.compile(r"\w+", re.UNICODE)


def rouge_l(reference: Answer, answer: Answer) -> Grade:
    """ROUGE-L F1: the longest common subsequence of words, against both lengths."""
    ref, hyp = _WORD.findall(reference.text.casefold()), _WORD.findall(answer.text.casefold())
    if not ref or not hyp:
        return Grade(float(ref == hyp))
    previous = [0] * (len(hyp) + 1)
    for word in ref:
        current = [0]
        for j, other in enumerate(hyp):
            current.append(previous[j] + 1 if word == other else max(previous[j + 1], current[j]))
        previous = current
    lcs = previous[-1]
    if lcs == 0:
        return Grade(0.0, {"lcs": 0})
    precision, recall = lcs / len(hyp), lcs / len(ref)
    return Grade(2 * precision * recall / (precision + recall), {"lcs": lcs})


def _arguments(text: str) -> Any:
    try:
        return json.loads(text or "{}")
    except ValueError:
        return None


def tool_calls(reference: Answer, answer: Answer) -> Grade:
    """Each reference call counts half for a call of the same name and half more when its
    arguments are equal as JSON; calls are matched by name in order, extra calls cost their
    share of the larger count. A reference without calls is graded as text (ROUGE-L)."""
    if not reference.tool_calls:
        return rouge_l(reference, answer)
    remaining = list(answer.tool_calls)
    points = 0.0
    for name, arguments in reference.tool_calls:
        match = next((call for call in remaining if call[0] == name), None)
        if match is None:
            continue
        remaining.remove(match)
        points += 0.5 + 0.5 * (_arguments(match[1]) == _arguments(arguments))
    total = max(len(reference.tool_calls), len(answer.tool_calls))
    return Grade(points / total, {"calls": len(answer.tool_calls)})


GRADERS: dict[TaskKind, Grader] = {
    "json": json_fields,
    "short_label": exact_label,
    "free_text": rouge_l,
    "tool_calls": tool_calls,
}


def grader_for(kind: TaskKind) -> Grader:
    return GRADERS[kind]

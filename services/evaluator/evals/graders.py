"""The Evals API's deterministic graders: `string_check` and `text_similarity`, and grading one
item with an eval's testing criteria.

string_check (OpenAI's graders guide): `eq` / `ne` compare exactly, `like` asks whether the
input contains the reference, `ilike` the same ignoring case; 1 or 0, passed at 1.

text_similarity, each a score in [0, 1] passed at `pass_threshold` or above, written here (no
nltk, rouge-score or rapidfuzz in the service):
- `fuzzy_match`: rapidfuzz's `fuzz.ratio` / 100 — the normalised Indel similarity of the two
  strings as given, 2·LCS / (len(input) + len(reference)) over characters.
- `bleu`: sentence BLEU-4, uniform weights, brevity penalty, no smoothing, with the effective
  order (n up to the shorter text's word count, so a two-word answer is scored on 1- and
  2-grams rather than always 0).
- `gleu`: Google-BLEU as nltk's `sentence_gleu`: min(precision, recall) of 1- to 4-grams.
- `rouge_1` ... `rouge_5`: n-gram F1; `rouge_l`: longest-common-subsequence F1 (the mid-run
  graders' own, services/evaluator/graders.py).
Word metrics read lower-cased `\\w+` tokens, as the mid-run ROUGE-L does. `cosine` (needs an
embedding model) and `meteor` (needs WordNet) are refused when the eval is created.

`score_model` / `label_model` are the LLM judge's (model_graders.py).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from services.evaluator import templating
from services.evaluator.evals import protocol
from services.evaluator.graders import Answer, rouge_l

_WORD = re.compile(r"\w+", re.UNICODE)
RESULT_TYPES = {
    "string_check": "string-check-grader",
    "text_similarity": "text-similarity-grader",
}


def string_check(operation: str, value: str, reference: str) -> float:
    if operation == "eq":
        return float(value == reference)
    if operation == "ne":
        return float(value != reference)
    if operation == "like":
        return float(reference in value)
    if operation == "ilike":
        return float(reference.casefold() in value.casefold())
    raise ValueError(f"operation: {operation!r} is not eq, ne, like or ilike")


def lcs_length(a: str, b: str) -> int:
    """Characters in a longest common subsequence, bit-parallel (Hyyrö 2004): one big-integer
    step per character of the longer text, not a table of len(a) x len(b) cells."""
    if len(a) < len(b):
        a, b = b, a
    if not b:
        return 0
    masks: dict[str, int] = {}
    for i, char in enumerate(b):
        masks[char] = masks.get(char, 0) | (1 << i)
    full = (1 << len(b)) - 1
    row = full
    for char in a:
        matched = row & masks.get(char, 0)
        row = ((row + matched) | (row - matched)) & full
    return len(b) - row.bit_count()


def fuzzy_match(value: str, reference: str) -> float:
    if not value and not reference:
        return 1.0
    return 2 * lcs_length(value, reference) / (len(value) + len(reference))


def _words(text: str) -> list[str]:
    return _WORD.findall(text.casefold())


def _ngrams(words: list[str], n: int) -> Counter[tuple[str, ...]]:
    return Counter(tuple(words[i : i + n]) for i in range(len(words) - n + 1))


def bleu(value: str, reference: str) -> float:
    hypothesis, expected = _words(value), _words(reference)
    if not hypothesis or not expected:
        return float(hypothesis == expected)
    order = min(4, len(hypothesis), len(expected))
    logs = 0.0
    for n in range(1, order + 1):
        got, want = _ngrams(hypothesis, n), _ngrams(expected, n)
        matches = sum((got & want).values())
        if matches == 0:
            return 0.0
        logs += math.log(matches / sum(got.values()))
    brevity = (
        1.0 if len(hypothesis) > len(expected) else math.exp(1 - len(expected) / len(hypothesis))
    )
    return brevity * math.exp(logs / order)


def gleu(value: str, reference: str) -> float:
    hypothesis, expected = _words(value), _words(reference)
    if not hypothesis or not expected:
        return float(hypothesis == expected)
    got: Counter[tuple[str, ...]] = Counter()
    want: Counter[tuple[str, ...]] = Counter()
    for n in range(1, 5):
        got += _ngrams(hypothesis, n)
        want += _ngrams(expected, n)
    matches = sum((got & want).values())
    return min(matches / sum(got.values()), matches / sum(want.values()))


def rouge_n(n: int) -> Callable[[str, str], float]:
    def score(value: str, reference: str) -> float:
        got, want = _ngrams(_words(value), n), _ngrams(_words(reference), n)
        if not got or not want:
            return float(not got and not want)
        overlap = sum((got & want).values())
        if overlap == 0:
            return 0.0
        precision, recall = overlap / sum(got.values()), overlap / sum(want.values())
        return 2 * precision * recall / (precision + recall)

    return score


def _rouge_l(value: str, reference: str) -> float:
    return rouge_l(Answer(reference), Answer(value)).score


METRICS: dict[str, Callable[[str, str], float]] = {
    "fuzzy_match": fuzzy_match,
    "bleu": bleu,
    "gleu": gleu,
    **{f"rouge_{n}": rouge_n(n) for n in range(1, 6)},
    "rouge_l": _rouge_l,
}


TextGrader = protocol.StringCheck | protocol.TextSimilarity


def result(
    name: str, kind: str, score: float, passed: bool, *, error: str | None = None,
    sample: dict[str, Any] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """One grader's result in an output item (OpenAI's shape; `error` when it could not grade)."""
    found: dict[str, Any] = {"name": name, "type": kind, "score": score, "passed": passed,
                             "sample": sample}  # fmt: skip
    if error is not None:
        found["error"] = error
    return found


def grade_text(criterion: TextGrader, context: Mapping[str, Any]) -> dict[str, Any]:
    """A string_check or text_similarity criterion on one item (`context`: item and sample)."""
    kind = RESULT_TYPES[criterion.type]
    try:
        value = templating.render(criterion.input, context)
        reference = templating.render(criterion.reference, context)
    except templating.TemplateError as exc:
        return result(criterion.name, kind, 0.0, False, error=str(exc))
    if isinstance(criterion, protocol.StringCheck):
        score = string_check(criterion.operation, value, reference)
        return result(criterion.name, kind, score, score == 1.0)
    score = METRICS[criterion.evaluation_metric](value, reference)
    return result(criterion.name, kind, score, score >= criterion.pass_threshold)


def status_of(results: list[dict[str, Any]]) -> str:
    """An item's status: error if any grader could not grade, else pass when every one passed."""
    if any("error" in r for r in results):
        return "error"
    return "pass" if all(r["passed"] for r in results) else "fail"

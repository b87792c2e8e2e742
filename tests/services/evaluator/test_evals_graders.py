"""The Evals API's deterministic graders as plain function calls: string_check's four
operations, the text-similarity metrics on hand-computed cases, the bit-parallel LCS against the
textbook table, and a criterion graded with its templates filled in (the templating itself:
test_templating.py)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.evaluator import templating
from services.evaluator.evals import graders, protocol


@pytest.mark.parametrize(
    ("operation", "value", "reference", "expected"),
    [
        ("eq", "Paris", "Paris", 1.0),
        ("eq", "paris", "Paris", 0.0),
        ("ne", "paris", "Paris", 1.0),
        ("ne", "Paris", "Paris", 0.0),
        ("like", "It is Paris.", "Paris", 1.0),
        ("like", "It is paris.", "Paris", 0.0),
        ("ilike", "It is PARIS.", "paris", 1.0),
        ("ilike", "It is Lyon.", "paris", 0.0),
    ],
)
def test_string_check(operation: str, value: str, reference: str, expected: float) -> None:
    assert graders.string_check(operation, value, reference) == expected


def _lcs_table(a: str, b: str) -> int:
    previous = [0] * (len(b) + 1)
    for x in a:
        current = [0]
        for j, y in enumerate(b):
            current.append(previous[j] + 1 if x == y else max(previous[j + 1], current[j]))
        previous = current
    return previous[-1]


@given(st.text(alphabet="abcd é", max_size=40), st.text(alphabet="abcd é", max_size=40))
def test_the_bit_parallel_lcs_is_the_textbook_one(a: str, b: str) -> None:
    assert graders.lcs_length(a, b) == _lcs_table(a, b)


def test_fuzzy_match_is_the_normalised_indel_similarity() -> None:
    # rapidfuzz.fuzz.ratio("kitten", "sitting") == 61.538...: LCS "ittn", 2 * 4 / 13.
    assert graders.fuzzy_match("kitten", "sitting") == pytest.approx(8 / 13)
    assert graders.fuzzy_match("", "") == 1.0
    assert graders.fuzzy_match("abc", "") == 0.0
    assert graders.fuzzy_match("Paris", "Paris") == 1.0


def test_bleu_gleu_and_rouge_on_hand_computed_cases() -> None:
    # 1- to 4-gram precisions 4/5, 3/4, 2/3, 1/2; equal lengths, no brevity penalty.
    assert graders.bleu("a b c d e", "a b c d f") == pytest.approx(0.2**0.25)
    assert graders.bleu("A B C", "a b c") == 1.0  # lower-cased words
    # Effective order: two words are scored on 1- and 2-grams, not always 0.
    assert graders.bleu("hello world", "hello world") == 1.0
    assert graders.bleu("hello there", "hello world") == 0.0
    # Brevity: 3 of a 4-word reference, every n-gram matching.
    assert graders.bleu("a b c", "a b c d") == pytest.approx(math.exp(1 - 4 / 3))
    # 10 matching n-grams of 14 on either side.
    assert graders.gleu("a b c d e", "a b c d f") == pytest.approx(10 / 14)
    assert graders.METRICS["rouge_1"]("a b c", "a b d") == pytest.approx(2 / 3)
    assert graders.METRICS["rouge_2"]("a b c", "a b d") == pytest.approx(0.5)
    assert graders.METRICS["rouge_l"]("the cat sat", "the cat is sitting") == pytest.approx(
        2 * (2 / 3) * (2 / 4) / (2 / 3 + 2 / 4)
    )
    assert graders.METRICS["rouge_5"]("a b", "a b") == 1.0  # neither has a 5-gram


def _criteria() -> list[graders.TextGrader]:
    return [
        protocol.StringCheck(type="string_check", name="exact", input="{{sample.output_text}}",
                             reference="{{item.answer}}", operation="eq"),
        protocol.TextSimilarity(type="text_similarity", name="close", input="{{sample.output_text}}",
                                reference="{{item.answer}}", evaluation_metric="fuzzy_match",
                                pass_threshold=0.8),
    ]  # fmt: skip


def test_grading_an_item_fills_the_templates_and_names_what_is_missing() -> None:
    exact, close = _criteria()
    context = {"item": {"answer": "Paris"}, "sample": templating.sample_context(
        {"output": [{"role": "assistant", "content": "Pariss"}]})}  # fmt: skip
    assert graders.grade_text(exact, context) == {
        "name": "exact", "type": "string-check-grader", "score": 0.0, "passed": False,
        "sample": None,
    }  # fmt: skip
    found = graders.grade_text(close, context)
    assert found["score"] == pytest.approx(10 / 11)
    assert found["passed"] is True
    missing = graders.grade_text(exact, {"item": {"answer": "Paris"}})
    assert missing["error"] == "{{sample.output_text}}: sample is not in this item"
    assert graders.status_of([found, missing]) == "error"
    assert graders.status_of([found]) == "pass"

"""The deterministic graders score what they claim: fields, labels, overlap and calls."""

from __future__ import annotations

import pytest

from services.evaluator.graders import (
    GRADERS,
    Answer,
    exact_label,
    grader_for,
    json_fields,
    rouge_l,
    tool_calls,
)
from shared.tasks import TASK_KINDS

REFERENCE = Answer('{"category": "billing", "priority": "high", "order_id": 1234, "refund": true}')


def test_json_fields_scores_the_share_of_matching_fields() -> None:
    got = Answer('{"category": "Billing ", "priority": "low", "order_id": 1234.0, "refund": true}')
    grade = json_fields(REFERENCE, got)
    assert grade.score == pytest.approx(0.75)
    assert grade.detail["wrong_fields"] == ["priority"]


def test_json_fields_forgives_a_fence_but_not_invalid_json() -> None:
    fenced = Answer(
        '```json\n{"category": "billing", "priority": "high", "order_id": 1234, "refund": true}\n```'
    )
    assert json_fields(REFERENCE, fenced).score == 1.0
    assert json_fields(REFERENCE, Answer('{"category": "billing",')).score == 0.0
    assert json_fields(REFERENCE, Answer('["billing"]')).detail == {"valid_json": False}


def test_json_fields_does_not_take_1_for_true() -> None:
    grade = json_fields(Answer('{"refund": true}'), Answer('{"refund": 1}'))
    assert grade.score == 0.0


def test_json_fields_names_extra_fields_without_charging_them() -> None:
    grade = json_fields(Answer('{"a": 1}'), Answer('{"a": 1, "b": 2}'))
    assert grade.score == 1.0
    assert grade.detail["extra_fields"] == ["b"]


def test_json_fields_refuses_a_reference_that_is_not_json() -> None:
    with pytest.raises(ValueError, match="reference"):
        json_fields(Answer("plain"), Answer("{}"))


@pytest.mark.parametrize(
    ("reference", "answer", "score"),
    [
        ("Positive", "positive.", 1.0),
        ("positive", " Positive ", 1.0),
        ("positive", "negative", 0.0),
    ],
)
def test_exact_label(reference: str, answer: str, score: float) -> None:
    assert exact_label(Answer(reference), Answer(answer)).score == score


def test_rouge_l_is_the_lcs_f_measure() -> None:
    # LCS of "the cat sat on the mat" / "the cat lay on the mat" is 5 words of 6 each.
    grade = rouge_l(Answer("The cat sat on the mat"), Answer("the cat lay on the mat"))
    assert grade.score == pytest.approx(5 / 6)
    assert rouge_l(Answer("a b c"), Answer("a b c")).score == 1.0
    assert rouge_l(Answer("a b c"), Answer("x y z")).score == 0.0
    assert rouge_l(Answer(""), Answer("")).score == 1.0


def test_tool_calls_scores_names_and_arguments() -> None:
    reference = Answer(tool_calls=(("lookup", '{"id": 7}'), ("refund", '{"amount": 5}')))
    right = Answer(tool_calls=(("refund", '{"amount":5}'), ("lookup", '{"id":7}')))
    assert tool_calls(reference, right).score == 1.0
    wrong_args = Answer(tool_calls=(("lookup", '{"id": 8}'), ("refund", '{"amount": 5}')))
    assert tool_calls(reference, wrong_args).score == pytest.approx(0.75)
    extra = Answer(tool_calls=(*right.tool_calls, ("delete", "{}")))
    assert tool_calls(reference, extra).score == pytest.approx(2 / 3)
    assert tool_calls(reference, Answer("no calls")).score == 0.0


def test_every_task_kind_has_its_grader() -> None:
    assert set(GRADERS) == set(TASK_KINDS)
    assert grader_for("json") is json_fields

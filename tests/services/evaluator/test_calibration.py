"""Judge-human agreement as plain functions: Kendall's tau-b (checked against scipy's documented
example, ties included), its bootstrap interval, exact agreement, and the trusted / untrusted /
not-enough-labels verdict with its reason."""

from __future__ import annotations

import pytest

from services.evaluator.calibration import (
    Pair,
    agreement,
    bootstrap_ci,
    exact_agreement,
    kendall_tau_b,
)


def test_tau_b_matches_the_textbook_values_with_and_without_ties() -> None:
    # scipy.stats.kendalltau's documented example (ties in both): -0.47140452079103173.
    assert kendall_tau_b([12, 2, 1, 12, 2], [1, 4, 7, 1, 0]) == pytest.approx(-0.4714045208)
    assert kendall_tau_b([1, 2, 3, 4], [1, 2, 3, 4]) == 1.0
    assert kendall_tau_b([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0
    assert kendall_tau_b([1, 2, 3], [1, 3, 2]) == pytest.approx(1 / 3)
    assert kendall_tau_b([1, 1, 1], [1, 2, 3]) is None  # no variation: no number
    assert kendall_tau_b([1], [1]) is None


def test_the_interval_holds_the_estimate_and_is_the_same_every_time() -> None:
    humans = [0.0, 0.1, 0.2, 0.4, 0.5, 0.5, 0.7, 0.8, 0.9, 1.0, 1.0, 0.3]
    judge = [0.1, 0.0, 0.3, 0.3, 0.6, 0.4, 0.8, 0.7, 1.0, 0.9, 0.8, 0.4]
    tau = kendall_tau_b(humans, judge)
    interval = bootstrap_ci(humans, judge)
    assert tau is not None
    assert interval is not None
    assert interval[0] <= tau <= interval[1] <= 1.0
    assert bootstrap_ci(humans, judge) == interval


def test_exact_agreement_compares_sides_for_pass_fail_and_steps_for_scores() -> None:
    pairs = [
        Pair(1.0, 0.8, pass_fail=True),  # pass, judge above 0.7: same
        Pair(0.0, 0.75, pass_fail=True),  # fail, judge passes it: differ
        Pair(0.5, 0.55),  # within one step of 0.1
        Pair(0.5, 0.7),  # two steps apart
    ]
    assert exact_agreement(pairs, 0.7) == 0.5
    assert exact_agreement([], 0.7) is None


def _pairs(humans: list[float], judge: list[float]) -> list[Pair]:
    return [Pair(h, j) for h, j in zip(humans, judge, strict=True)]


def test_agreeing_labels_are_trusted_and_disagreeing_ones_are_not() -> None:
    humans = [n / 11 for n in range(12)]
    agreeing = agreement(_pairs(humans, [h * 0.8 for h in humans]), pass_threshold=0.7)
    assert (agreeing.status, agreeing.labels, agreeing.kendall_tau) == ("trusted", 12, 1.0)
    assert agreeing.reason.startswith("Kendall's tau-b 1.00 (95% CI")
    assert "on 12 labels is at least 0.6" in agreeing.reason
    shuffled = [humans[i] for i in (3, 9, 0, 7, 11, 2, 5, 10, 1, 8, 4, 6)]
    disagreeing = agreement(_pairs(humans, shuffled), pass_threshold=0.7)
    assert disagreeing.status == "untrusted"
    assert disagreeing.kendall_tau is not None
    assert disagreeing.kendall_tau < 0.6
    assert "is below 0.6" in disagreeing.reason


def test_few_labels_or_no_variation_is_not_enough_labels_not_a_number() -> None:
    few = agreement(_pairs([0.0, 1.0, 0.5], [0.0, 1.0, 0.5]), pass_threshold=0.7)
    assert (few.status, few.labels) == ("not enough labels", 3)
    assert "at least 10 are needed" in few.reason
    alike = agreement(_pairs([1.0] * 12, [n / 12 for n in range(12)]), pass_threshold=0.7)
    assert (alike.status, alike.kendall_tau) == ("not enough labels", None)
    assert (
        alike.reason == "the labels are all the same on 12 answers, so agreement cannot be measured"
    )

"""Cadence, best checkpoint (ties to the earlier step), the decision and the gate."""

from __future__ import annotations

import pytest

from services.evaluator import decision, gate
from shared.tasks import TaskKind


def test_a_point_is_due_at_the_cadence_and_at_the_last_step() -> None:
    due = [s for s in range(1, 26) if decision.is_due(s, eval_every=10, last_step=25)]
    assert due == [10, 20, 25]
    assert not decision.is_due(10, eval_every=0, last_step=10)
    assert not decision.is_due(0, eval_every=10, last_step=25)


def test_planned_steps_wait_for_the_last_step_only_when_it_was_saved() -> None:
    assert decision.planned_steps(eval_every=10, last_step=25, last_saved=True) == [10, 20, 25]
    assert decision.planned_steps(eval_every=10, last_step=25, last_saved=False) == [10, 20]
    assert decision.planned_steps(eval_every=10, last_step=30, last_saved=True) == [10, 20, 30]
    assert decision.planned_steps(eval_every=0, last_step=30, last_saved=True) == []


def test_the_best_is_the_highest_score_and_a_tie_goes_to_the_earlier_step() -> None:
    assert decision.best_of({10: 0.5, 20: 0.9, 30: 0.9, 40: 0.7}) == (20, 0.9)
    assert decision.best_of({30: 0.9, 20: 0.9}) == (20, 0.9)
    assert decision.best_of({}) is None


URIS = {10: "s3://b/c/step-10/", 20: "s3://b/c/step-20/", 30: "s3://b/c/step-30/"}


def test_the_decision_takes_the_best_point_and_passes_a_clear_improvement() -> None:
    made = decision.decide(
        kind="json",
        eval_every=10,
        scores={10: 0.7, 20: 0.95, 30: 0.95},
        uris=URIS,
        base_score=0.3,
        last_step=30,
        last_uri=URIS[30],
    )
    assert (made.best_step, made.best_checkpoint_uri, made.best_score) == (20, URIS[20], 0.95)
    assert made.gate == "passed"
    assert made.scores == {10: 0.7, 20: 0.95, 30: 0.95}


def test_no_evals_planned_decides_the_last_checkpoint_ungated() -> None:
    made = decision.decide(
        kind="json", eval_every=0, scores={}, uris={}, base_score=None, last_step=50,
        last_uri="s3://b/c/step-50/",
    )  # fmt: skip
    assert (made.best_step, made.best_checkpoint_uri, made.gate) == (50, "s3://b/c/step-50/", None)
    assert made.best_score is None


def test_evals_planned_but_none_scored_is_rejected_with_the_reason() -> None:
    made = decision.decide(
        kind="json", eval_every=10, scores={}, uris={}, base_score=0.2, last_step=5,
        last_uri="s3://b/c/step-5/", no_eval_reason="no eval subset: eval.jsonl line 3: bad",
    )  # fmt: skip
    assert made.gate == "rejected"
    assert "eval.jsonl line 3" in made.gate_reason
    assert made.best_checkpoint_uri == "s3://b/c/step-5/"


@pytest.mark.parametrize(
    ("kind", "best", "base", "outcome", "why"),
    [
        ("json", 0.85, 0.80, "passed", "beats"),  # exactly base + margin passes (0.8 + 0.05)
        ("json", 0.84, 0.80, "rejected", "margin"),
        ("json", 0.79, 0.10, "rejected", "threshold"),
        ("json", 0.80, 0.10, "passed", "reaches"),  # exactly the threshold passes
        ("short_label", 0.875, 0.8125, "rejected", "margin"),  # one item better: noise
        ("short_label", 0.9375, 0.8125, "passed", "beats"),  # two items better
        ("tool_calls", 0.69, 0.0, "rejected", "threshold"),
        ("free_text", 0.40, 0.36, "rejected", "margin"),
        ("json", 0.95, None, "rejected", "not scored"),
    ],
)
def test_the_gate_needs_the_threshold_and_the_margin_over_the_base(
    kind: TaskKind, best: float, base: float | None, outcome: str, why: str
) -> None:
    got, reason = gate.judge(kind, best=best, base=base)
    assert got == outcome, reason
    assert why in reason


def test_a_checkpoint_worse_than_the_base_is_rejected_even_above_the_threshold() -> None:
    made = decision.decide(
        kind="json", eval_every=10, scores={10: 0.9, 20: 0.88}, uris=URIS, base_score=0.92,
        last_step=20, last_uri=URIS[20],
    )  # fmt: skip
    assert made.gate == "rejected"
    assert "does not beat the base model's 0.920" in made.gate_reason

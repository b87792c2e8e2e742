"""Beats the serving version: the rule, the scale the serving version is scored on, and the words
the job's events carry (the flow on real processes: test_serving_flow.py)."""

from __future__ import annotations

from services.evaluator import serving_baseline
from services.evaluator.engine_client import Output, Serving
from services.evaluator.graders import Answer
from services.evaluator.scoring import ItemResult
from services.evaluator.subset import EvalItem

SERVING = Serving("dep-1", "mv-abc", 3, "ft:b:tickets:ftjob-1", "b", "s3://x/ckpt/")


def test_beating_is_at_least_the_serving_mean_plus_the_margin() -> None:
    assert serving_baseline.beats(0.84, 0.84, 0.0)  # not worse is enough by default
    assert serving_baseline.beats(0.85, 0.84, 0.0)
    assert not serving_baseline.beats(0.81, 0.84, 0.0)
    assert serving_baseline.beats(0.85, 0.80, 0.05)  # float error forgiven, as the gate does
    assert not serving_baseline.beats(0.84, 0.80, 0.05)


def _result(score: float, detail: dict[str, object]) -> ItemResult:
    item = EvalItem(0, "s", [{"role": "user", "content": "q"}], [], Answer("a"), 32)
    return ItemResult(item, Output(Answer("a"), 1.0), score, detail)


def test_the_serving_score_is_on_the_decisions_own_scale() -> None:
    judged = [
        _result(0.9, {"judge": {"score": 9}, "deterministic": {"score": 0.5}}),
        _result(0.0, {"judge_error": "unreadable", "deterministic": {"score": 1.0}}),
        _result(0.0, {}),  # the engine refused the prompt: 0 on either scale
    ]
    # The judge chose: its verdicts, its errors left out as re-scoring leaves them out.
    assert serving_baseline.scores_on_scale(judged, deterministic=False) == [0.9, 0.0]
    # The choice fell back to the deterministic grades: those, every item counted.
    assert serving_baseline.scores_on_scale(judged, deterministic=True) == [0.5, 1.0, 0.0]
    plain = [_result(1.0, {"valid_json": True}), _result(0.5, {"lcs": 2})]
    assert serving_baseline.scores_on_scale(plain, deterministic=True) == [1.0, 0.5]


def test_the_words_say_the_scores_the_items_the_version_and_what_follows() -> None:
    label = serving_baseline.served_label(SERVING)
    assert label == "v3 (mv-abc)"
    lost = serving_baseline.describe(
        new=0.81, serving=0.84, items=40, label=label, name="tickets", margin=0.0, won=False
    )
    assert lost == (
        "The new version scored 0.810 on 40 eval items; the serving version v3 (mv-abc) of "
        "'tickets' scored 0.840: not deployed as a canary (it must score at least the serving "
        "version's score)."
    )
    won = serving_baseline.describe(
        new=0.86, serving=0.84, items=40, label=label, name="tickets", margin=0.0, won=True
    )
    assert won.endswith("scored 0.840: it is deployed as the canary of 'tickets'.")
    margin = serving_baseline.describe(
        new=0.85, serving=0.84, items=40, label=label, name="tickets", margin=0.02, won=False
    )
    assert margin.endswith("score + the margin 0.02).")
    base = Serving("dep-2", None, None, "SmolLM2-135M-Instruct", None, None)
    assert serving_baseline.served_label(base) == "SmolLM2-135M-Instruct"

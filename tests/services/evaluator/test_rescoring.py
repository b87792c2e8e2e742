"""Re-scoring before the final choice: the candidates, the rest of the split (read from a real
snapshot in S3), the combined mean, and the decision and its words once re-scored."""

from __future__ import annotations

from pathlib import Path

from services.evaluator import decision, rescoring, subset
from services.evaluator.decision import Rescored
from shared.storage import ObjectStore
from tests.services.evaluator.samples import ticket

URIS = {s: f"s3://b/c/step-{s}/" for s in (10, 20, 30, 40)}


def test_the_candidates_are_the_top_scores_earlier_first_among_equals() -> None:
    scores = {10: 0.5, 20: 0.8, 30: 0.9, 40: 0.8}
    assert rescoring.candidates(scores, 3) == [30, 20, 40]
    assert rescoring.candidates(scores, 2) == [30, 20]
    assert rescoring.candidates(scores, 10) == [30, 20, 40, 10]
    # Nothing re-scoring could change: off (under 2), or one checkpoint only.
    assert rescoring.candidates(scores, 1) == []
    assert rescoring.candidates({10: 0.5}, 3) == []


def test_the_combined_score_is_the_mean_over_every_item() -> None:
    assert rescoring.combined([1.0] * 16, [0.0] * 16) == 0.5
    assert rescoring.combined([1.0, 0.5], [0.0]) == 0.5
    assert rescoring.combined([], []) == 0.0


def test_an_item_the_judge_could_not_score_is_left_out_not_counted_as_zero() -> None:
    judged = [(0.9, {"judge": {"score": 9}}), (0.0, {"judge_error": "unreadable twice"}),
              (0.7, {"judge": {"score": 7}}), (1.0, {"exact": True})]  # fmt: skip
    scores = rescoring.verdict_scores(judged)
    assert scores == [0.9, 0.7, 1.0]
    assert rescoring.combined(scores[:2], scores[2:]) == (0.9 + 0.7 + 1.0) / 3


def _snapshot(store: ObjectStore, tmp_path: Path, count: int) -> str:
    lines = [ticket(n).to_json_bytes() for n in range(count)]
    lines.append(ticket(99, answered=False).to_json_bytes())  # never an item
    (tmp_path / "eval.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    (tmp_path / "train.jsonl").write_bytes(b"")
    store.put_dir(tmp_path, "tenants/acme/datasets/rest")
    return store.uri("tenants/acme/datasets/rest/")


def test_the_rest_of_the_split_is_what_the_subset_lacks_up_to_the_bound(
    object_store: ObjectStore, tmp_path: Path
) -> None:
    uri = _snapshot(object_store, tmp_path, 40)
    items = subset.build_subset(object_store, dataset_uri=uri, dataset_version="v1", eval_items=16)
    ids = {i.sample_id for i in items}

    def rest(max_items: int) -> list[subset.EvalItem]:
        return rescoring.rest_of_split(
            object_store, dataset_uri=uri, dataset_version="v1", subset_ids=ids,
            max_items=max_items,
        )  # fmt: skip

    every = rest(200)
    assert len(every) == 24  # 40 answered tickets, 16 in the subset
    assert not ids & {i.sample_id for i in every}
    assert [i.position for i in every] == list(range(16, 40))  # numbered after the subset
    assert [i.sample_id for i in rest(20)] == [i.sample_id for i in every[:4]]  # the bound
    assert rest(16) == []  # the bound is within the subset: nothing else
    assert rest(8) == []


def test_a_rescored_decision_takes_the_best_on_the_whole_split_and_says_what_changed() -> None:
    scores = {10: 0.7, 20: 0.875, 30: 0.8125, 40: 0.8125}
    rescored = Rescored(items=48, subset_items=16, scores={20: 0.81, 30: 0.86, 40: 0.79})
    made = decision.decide(
        kind="json", eval_every=10, scores=scores, uris=URIS, base_score=0.25, last_step=40,
        last_uri=URIS[40], rescored=rescored,
    )  # fmt: skip
    assert (made.best_step, made.best_checkpoint_uri, made.best_score) == (30, URIS[30], 0.86)
    assert made.base_score == 0.25
    assert made.scores == scores  # the subset's curve, as published
    assert (made.rescored, made.rescored_items) == ({20: 0.81, 30: 0.86, 40: 0.79}, 48)
    assert made.gate == "passed"
    assert made.gate_reason == (
        "Re-scored the top 3 checkpoints on the whole eval split (48 items, the subset's 16 among "
        "them): step 30 0.860 (subset 0.812), step 20 0.810 (subset 0.875), step 40 0.790 (subset "
        "0.812); the choice moved from step 20, the best on the subset, to step 30. The gate: "
        "best task score 0.860 reaches the json threshold 0.80, and on the subset the base "
        "answered, its score 0.812 beats the base model's 0.250 by at least 0.05."
    )


def test_the_threshold_reads_the_whole_split_and_the_margin_the_subset_the_base_answered() -> None:
    below = Rescored(items=32, subset_items=16, scores={20: 0.78, 30: 0.70})
    made = decision.decide(
        kind="json", eval_every=10, scores={10: 0.5, 20: 0.82, 30: 0.81}, uris=URIS,
        base_score=0.1, last_step=30, last_uri=URIS[30], rescored=below,
    )  # fmt: skip
    assert (made.best_step, made.best_score) == (20, 0.78)
    assert made.gate == "rejected"  # 0.82 on the subset, 0.78 on the split: under 0.80
    assert "step 20, the best on the subset, stays the choice" in made.gate_reason
    assert "best task score 0.780 is below the json threshold 0.80" in made.gate_reason
    # 0.9 on the split, but on the items the base answered only 0.02 better than the base.
    close = Rescored(items=32, subset_items=16, scores={20: 0.9, 30: 0.85})
    made = decision.decide(
        kind="json", eval_every=10, scores={10: 0.5, 20: 0.82, 30: 0.81}, uris=URIS,
        base_score=0.8, last_step=30, last_uri=URIS[30], rescored=close,
    )  # fmt: skip
    assert made.gate == "rejected"
    assert (
        "on the subset the base answered, its score 0.820 does not beat the base model's 0.800 "
        "by the json margin 0.05"
    ) in made.gate_reason


def test_a_note_is_added_when_nothing_was_rescored() -> None:
    note = "No re-scoring: the subset (16 items) is the whole split."
    made = decision.decide(
        kind="json", eval_every=10, scores={10: 0.7, 20: 0.9}, uris=URIS, base_score=0.2,
        last_step=20, last_uri=URIS[20], rescored=Rescored(note=note),
    )  # fmt: skip
    assert (made.best_step, made.best_score, made.rescored) == (20, 0.9, {})
    assert made.gate_reason.endswith(f"by at least 0.05. {note}")

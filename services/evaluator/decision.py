"""Which checkpoints are scored, which is best, and the final decision, as plain functions of the
plan and the scores (the handlers store and publish what these return).

A point is due when its step is a multiple of eval_every or the job's last step (the plan's
`steps` until training reports where it ended). The best is the highest mean task score; a tie
goes to the earlier step (less training for the same score). The decision waits for training to
end and for every planned point: each multiple of eval_every up to the last step, and the last
step itself when it has a checkpoint. When the top checkpoints were re-scored on the whole eval
split (rescoring.py), the choice and the gate's threshold read those scores; the margin over the
base still compares the subset, the items the base answered.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from services.evaluator.gate import GateOutcome, judge
from shared.tasks import TaskKind


def is_due(step: int, *, eval_every: int, last_step: int) -> bool:
    if eval_every <= 0 or step <= 0:
        return False
    return step % eval_every == 0 or step == last_step


def planned_steps(*, eval_every: int, last_step: int, last_saved: bool) -> list[int]:
    """The points the decision waits for, once training ended at `last_step` (`last_saved`:
    a checkpoint of the last step exists)."""
    if eval_every <= 0:
        return []
    steps = list(range(eval_every, last_step + 1, eval_every))
    if last_saved and last_step > 0 and last_step not in steps:
        steps.append(last_step)
    return steps


def best_of(scores: dict[int, float]) -> tuple[int, float] | None:
    """(step, score) of the highest score, the earliest step among equals; None when empty."""
    if not scores:
        return None
    step = min(scores, key=lambda s: (-scores[s], s))
    return step, scores[step]


@dataclass(frozen=True)
class Rescored:
    """The whole eval split's scores (`items` items) of the top checkpoints, or `note`: why
    nothing was re-scored."""

    items: int = 0
    subset_items: int = 0
    scores: dict[int, float] = field(default_factory=dict)
    note: str = ""
    # The grader named in the words when it is not the one the points were scored by (a judged
    # job whose choice fell back: "deterministic ROUGE-L"); "" says nothing of it.
    grader: str = ""


@dataclass(frozen=True)
class Decision:
    best_step: int
    best_checkpoint_uri: str
    best_score: float | None
    base_score: float | None
    scores: dict[int, float] = field(default_factory=dict)
    gate: GateOutcome | None = None
    gate_reason: str = ""
    # The whole split's scores by step when the top checkpoints were re-scored (best_score is
    # then on it too), and how many items that was.
    rescored: dict[int, float] = field(default_factory=dict)
    rescored_items: int | None = None
    # A judged job whose choice fell back to the deterministic scores (judging.settle): what
    # the serving version is compared on.
    judge_fallback: bool = False
    # An auto-deploying job whose served name has a primary (serving_baseline.py): that
    # version, its score on the items best_score was measured on, and whether this one beats it.
    serving_version_id: str | None = None
    serving_score: float | None = None
    serving_items: int | None = None
    beats_serving: bool | None = None


def decide(
    *,
    kind: TaskKind,
    eval_every: int,
    scores: dict[int, float],
    uris: dict[int, str],
    base_score: float | None,
    last_step: int,
    last_uri: str,
    no_eval_reason: str | None = None,
    rescored: Rescored | None = None,
) -> Decision:
    """The job's model: the best scored point, gated; with no evals planned (eval_every 0) the
    last checkpoint, ungated; with evals planned but none scored (`no_eval_reason`, or no
    checkpoint at the cadence) the last checkpoint, rejected. `rescored`: the best on the whole
    split among the re-scored."""
    if eval_every <= 0:
        return Decision(last_step, last_uri, None, None, gate=None, gate_reason="no evals planned")
    best = best_of(scores)
    if best is None or no_eval_reason is not None:
        reason = no_eval_reason or "no checkpoint at the eval cadence was saved, so none was scored"
        return Decision(last_step, last_uri, None, base_score, scores, "rejected", reason)
    if rescored is not None and rescored.scores:
        return _decide_rescored(kind, scores, uris, base_score, best[0], rescored)
    step, score = best
    outcome, reason = judge(kind, best=score, base=base_score)
    note = f". {rescored.note}" if rescored is not None and rescored.note else ""
    return Decision(step, uris[step], score, base_score, dict(scores), outcome, reason + note)


def _decide_rescored(
    kind: TaskKind,
    scores: dict[int, float],
    uris: dict[int, str],
    base_score: float | None,
    subset_best: int,
    rescored: Rescored,
) -> Decision:
    found = best_of(rescored.scores)
    assert found is not None
    step, score = found
    outcome, reason = judge(kind, best=score, base=base_score, paired=scores[step])
    text = f"{describe(rescored, scores, subset_best)} The gate: {reason}."
    return Decision(
        step, uris[step], score, base_score, dict(scores), outcome, text, dict(rescored.scores),
        rescored.items,
    )  # fmt: skip


def describe(rescored: Rescored, scores: dict[int, float], subset_best: int) -> str:
    """What was re-scored and what it changed, in words."""
    parts = [
        f"step {s} {rescored.scores[s]:.3f} (subset {scores[s]:.3f})"
        for s in sorted(rescored.scores, key=lambda s: (-rescored.scores[s], s))
    ]
    found = best_of(rescored.scores)
    assert found is not None
    verdict = (
        f"step {subset_best}, the best on the subset, stays the choice"
        if found[0] == subset_best
        else f"the choice moved from step {subset_best}, the best on the subset, to step {found[0]}"
    )
    by = f" with the {rescored.grader} scores too" if rescored.grader else ""
    return (
        f"Re-scored the top {len(parts)} checkpoints on the whole eval split{by} "
        f"({rescored.items} items, the subset's {rescored.subset_items} among them): "
        f"{', '.join(parts)}; {verdict}."
    )

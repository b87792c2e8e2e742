"""The eval gate: a job's best checkpoint is deployable only if it is good in absolute terms (the
task kind's threshold) and better than the base model by a margin (so a best-of-several pick on
a small subset cannot pass a model no better than the base). Defaults per task kind below, and
the gate on the judge's scale for a job the judge chose for (judge_gate); the reasons are in
docs/evaluator.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from shared.tasks import TaskKind

GateOutcome = Literal["passed", "rejected"]
# Scores are means of floats: 0.8 + 0.05 is 0.8500000000000001, and 0.85 must pass it.
_EPSILON = 1e-9


@dataclass(frozen=True)
class Gate:
    threshold: float
    margin: float


GATES: dict[TaskKind, Gate] = {
    # Per-field credit: 16 items x ~7 fields is ~100 graded decisions, 0.05 is ~5 fields net.
    "json": Gate(threshold=0.8, margin=0.05),
    # One item is 1/16 = 0.0625 of the mean: 0.1 asks for two more items right than the base.
    "short_label": Gate(threshold=0.8, margin=0.1),
    # Half credit for the name, half for the arguments: 0.1 is ~3 half-calls net.
    "tool_calls": Gate(threshold=0.7, margin=0.1),
    # ROUGE-L of a good paraphrase is often 0.3-0.5; the margin is what one reworded item moves.
    "free_text": Gate(threshold=0.3, margin=0.05),
}


def gate_for(kind: TaskKind) -> Gate:
    return GATES[kind]


def judge(
    kind: TaskKind, *, best: float, base: float | None, paired: float | None = None
) -> tuple[GateOutcome, str]:
    """passed or rejected, and a one-line reason naming the numbers and the rule. `paired`: the
    best checkpoint's score on the items the base answered, when `best` is on more of the split
    (re-scored): the threshold reads `best`, the margin compares like with like."""
    gate = gate_for(kind)
    if best + _EPSILON < gate.threshold:
        return "rejected", (
            f"best task score {best:.3f} is below the {kind} threshold {gate.threshold:.2f}"
        )
    if base is None:
        return "rejected", "the base model was not scored, so the margin over it is unknown"
    mine = best if paired is None else paired
    what = "best task score" if paired is None else "on the subset the base answered, its score"
    if mine + _EPSILON < base + gate.margin:
        return "rejected", (
            f"{what} {mine:.3f} does not beat the base model's {base:.3f} "
            f"by the {kind} margin {gate.margin:.2f}"
        )
    if paired is not None:
        return "passed", (
            f"best task score {best:.3f} reaches the {kind} threshold {gate.threshold:.2f}, and "
            f"{what} {mine:.3f} beats the base model's {base:.3f} by at least {gate.margin:.2f}"
        )
    return "passed", (
        f"best task score {best:.3f} reaches the {kind} threshold {gate.threshold:.2f} "
        f"and beats the base model's {base:.3f} by at least {gate.margin:.2f}"
    )


# The gate on judge scores (0-10 scaled to [0, 1]): 6/10 is an answer the rubric calls
# acceptable; a margin of 0.05 on 16 items is 8 points of the scale in all (one item going from
# wrong to right, or four items two points each): more than a reworded answer moves.
JUDGE_THRESHOLD, JUDGE_MARGIN = 0.6, 0.05


def judge_gate(best: float, base: float | None) -> tuple[GateOutcome, str]:
    if best + _EPSILON < JUDGE_THRESHOLD:
        return "rejected", (
            f"best judge score {best:.3f} is below the judge threshold {JUDGE_THRESHOLD:.2f}"
        )
    if base is None:
        return "rejected", "the base model was not scored, so the margin over it is unknown"
    if best + _EPSILON < base + JUDGE_MARGIN:
        return "rejected", (
            f"best judge score {best:.3f} does not beat the base model's {base:.3f} by the "
            f"judge margin {JUDGE_MARGIN:.2f}"
        )
    return "passed", (
        f"best judge score {best:.3f} reaches the judge threshold {JUDGE_THRESHOLD:.2f} and "
        f"beats the base model's {base:.3f} by at least {JUDGE_MARGIN:.2f}"
    )

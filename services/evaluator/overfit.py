"""The overfit stop: when to ask the scheduler to end a run early, as a plain function of the
scored checkpoints (their task score on the fixed subset and the train loss the trainer reported).

Overfitting is the task score falling while the train loss keeps falling: the model fits the
training data better and the task worse. The rule asks for `evals` falls in a row (each scored
point at least `margin` below the one before it, with a lower loss than the one before it), so
one noisy point does not end a run; a score falling while the loss rises is instability or
underfitting, which stopping would not cure, and a point without a loss never counts.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

# Comparisons allow this much float error (0.85 - 0.02 must count as a fall to 0.83).
_EPSILON = 1e-9
REASON_LIMIT = 1000  # JobEarlyStopRequested.reason's max_length


@dataclass(frozen=True)
class Rule:
    evals: int = 3  # K: consecutive falls
    margin: float = 0.02  # each fall at least this much of the mean task score


@dataclass(frozen=True)
class Scored:
    """A scored checkpoint: its step, its mean task score, the mean train loss since the
    checkpoint before it (None when the trainer reported none)."""

    step: int
    score: float
    train_loss: float | None


def _fell(before: Scored, after: Scored, margin: float) -> bool:
    if before.train_loss is None or after.train_loss is None:
        return False
    drop = before.score - after.score
    return drop > 0 and drop >= margin - _EPSILON and after.train_loss < before.train_loss


def overfitting(points: Sequence[Scored], rule: Rule = Rule()) -> str | None:
    """Why the run should stop, in words, at the first run of `rule.evals` falls in step order;
    None while there is none."""
    ordered = sorted(points, key=lambda p: p.step)
    for start in range(len(ordered) - rule.evals):
        window = ordered[start : start + rule.evals + 1]
        if all(_fell(a, b, rule.margin) for a, b in itertools.pairwise(window)):
            return _reason(window, ordered, rule)
    return None


def _reason(window: Sequence[Scored], ordered: Sequence[Scored], rule: Rule) -> str:
    scores = ", ".join(f"step {p.step} {p.score:.3f}" for p in window)
    losses = ", ".join(f"{p.train_loss:.4f}" for p in window)
    best = min(ordered[: ordered.index(window[-1]) + 1], key=lambda p: (-p.score, p.step))
    text = (
        f"overfitting: the task score fell {rule.evals} evals in a row by at least "
        f"{rule.margin:g} each ({scores}) while the train loss kept falling ({losses}); "
        f"the best so far is step {best.step} ({best.score:.3f})"
    )
    return text[:REASON_LIMIT]

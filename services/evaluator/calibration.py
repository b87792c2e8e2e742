"""Judge-human agreement: is the judge trusted to choose a checkpoint?

People label answers (a score in [0, 1], or pass/fail as 1/0); the judge scored the same
answers (its 0-10 scaled to [0, 1]). Agreement is Kendall's tau-b between the two (rank
agreement, so a judge that is strict on every item but orders them as people do still agrees),
with a bootstrap 95 % interval, and exact agreement: the share of labels the judge matches
(pass/fail labels: the same side of the pass threshold; scores: within 0.05, one step of the
0-10 scale). Trusted when tau-b >= 0.6 on >= 10 labels with variation on both sides; fewer
labels, or all alike, is `not enough labels` rather than a number (KNOWLEDGE.md).

tau-b is written here (numpy, vectorised over bootstrap resamples): scipy is not a dependency.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

Status = Literal["trusted", "untrusted", "not enough labels"]
MIN_LABELS = 10
TRUSTED_TAU = 0.6
RESAMPLES = 1000
SCORE_TOLERANCE = 0.05
_SEED = 0  # the same labels give the same interval


@dataclass(frozen=True)
class Pair:
    """A labelled answer: the person's score and the judge's, both in [0, 1]."""

    human: float
    judge: float
    pass_fail: bool = False  # the person said pass (1) or fail (0) rather than a score


@dataclass(frozen=True)
class Agreement:
    status: Status
    labels: int
    kendall_tau: float | None
    tau_ci95: tuple[float, float] | None
    exact_agreement: float | None
    reason: str


def _tau_b(x: npt.NDArray[np.float64], y: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """tau-b of each row pair of x and y (shape (batch, n)); NaN where a row has no variation.
    sum(sgn dx * sgn dy) / sqrt(sum(sgn dx)^2 * sum(sgn dy)^2) over all ordered pairs: ties
    drop out of the numerator and of their own side's denominator, as tau-b asks."""
    dx = np.sign(x[:, :, None] - x[:, None, :])
    dy = np.sign(y[:, :, None] - y[:, None, :])
    concordance = (dx * dy).sum(axis=(1, 2))
    norm = np.sqrt(np.abs(dx).sum(axis=(1, 2)) * np.abs(dy).sum(axis=(1, 2)))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(norm > 0, concordance / norm, np.nan)


def kendall_tau_b(x: list[float], y: list[float]) -> float | None:
    """tau-b of two equally long lists; None when either has no variation (or n < 2)."""
    if len(x) != len(y):
        raise ValueError(f"kendall_tau_b: {len(x)} and {len(y)} values")
    if len(x) < 2:
        return None
    tau = float(_tau_b(np.array([x], dtype=float), np.array([y], dtype=float))[0])
    return None if np.isnan(tau) else tau


def bootstrap_ci(
    x: list[float], y: list[float], *, resamples: int = RESAMPLES, seed: int = _SEED
) -> tuple[float, float] | None:
    """The 2.5th and 97.5th percentiles of tau-b over resamples of the pairs (with
    replacement); resamples without variation are left out. None when none has any."""
    n = len(x)
    if n < 2:
        return None
    rng = np.random.default_rng(seed)
    xs, ys = np.array(x, dtype=float), np.array(y, dtype=float)
    chunk = max(1, 2_000_000 // (n * n))  # bounds the (chunk, n, n) sign arrays
    taus = []
    for start in range(0, resamples, chunk):
        picks = rng.integers(0, n, size=(min(chunk, resamples - start), n))
        taus.append(_tau_b(xs[picks], ys[picks]))
    values = np.concatenate(taus)
    values = values[~np.isnan(values)]
    if values.size == 0:
        return None
    low, high = np.percentile(values, [2.5, 97.5])
    return float(low), float(high)


def exact_agreement(pairs: list[Pair], pass_threshold: float) -> float | None:
    if not pairs:
        return None
    same = 0
    for pair in pairs:
        if pair.pass_fail:
            same += (pair.human >= 0.5) == (pair.judge >= pass_threshold)
        else:
            same += abs(pair.human - pair.judge) <= SCORE_TOLERANCE + 1e-9
    return same / len(pairs)


def agreement(
    pairs: list[Pair],
    *,
    pass_threshold: float,
    min_labels: int = MIN_LABELS,
    trusted_tau: float = TRUSTED_TAU,
) -> Agreement:
    """The report on these labels, with the reason in words."""
    n = len(pairs)
    humans, judged = [p.human for p in pairs], [p.judge for p in pairs]
    exact = exact_agreement(pairs, pass_threshold)
    tau = kendall_tau_b(humans, judged)
    interval = bootstrap_ci(humans, judged) if tau is not None else None
    if n < min_labels:
        reason = f"{n} labelled answers with a judge score; at least {min_labels} are needed"
        return Agreement("not enough labels", n, tau, interval, exact, reason)
    if tau is None:
        alike = "the labels" if len(set(humans)) < 2 else "the judge's scores"
        reason = f"{alike} are all the same on {n} answers, so agreement cannot be measured"
        return Agreement("not enough labels", n, None, None, exact, reason)
    shown = f"Kendall's tau-b {tau:.2f}"
    if interval is not None:
        shown += f" (95% CI {interval[0]:.2f} to {interval[1]:.2f})"
    shown += f" on {n} labels"
    if tau >= trusted_tau:
        return Agreement("trusted", n, tau, interval, exact, f"{shown} is at least {trusted_tau}")
    reason = f"{shown} is below {trusted_tau}"
    return Agreement("untrusted", n, tau, interval, exact, reason)

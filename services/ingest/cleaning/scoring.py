"""Rejection sampling: keep only samples whose score reaches a threshold.

A sample's score is the number under metadata[score_key] (a judge's score; a numeric string
counts), else the last tag `<score_key>:<number>` (a feedback tag such as `score:4`). A sample
with neither is removed with reason "no_score": asking for a threshold means unscored samples
are unknown quality, not good ones.
"""

from __future__ import annotations

import math
from collections import Counter

from services.ingest.cleaning.report import StepReport
from shared.chat import Sample


def _number(value: object) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def sample_score(sample: Sample, key: str) -> float | None:
    if (score := _number(sample.metadata.get(key))) is not None:
        return score
    prefix = f"{key}:"
    for tag in reversed(sample.tags):
        if tag.startswith(prefix) and (score := _number(tag[len(prefix) :])) is not None:
            return score
    return None


def filter_by_score(
    samples: list[Sample], min_score: float, key: str
) -> tuple[list[Sample], StepReport]:
    kept: list[Sample] = []
    removed: Counter[str] = Counter()
    for sample in samples:
        score = sample_score(sample, key)
        if score is None:
            removed["no_score"] += 1
        elif score < min_score:
            removed["below_min_score"] += 1
        else:
            kept.append(sample)
    return kept, StepReport.of("min_score", len(samples), removed)

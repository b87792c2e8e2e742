"""Rejection sampling: keep only samples whose score reaches a threshold.

A sample's score is, with the default key `score`, its newest feedback score (POST
/v1/feedback: an explicit verdict on that very answer, so it comes first); else the number under
metadata[score_key] (a judge's score; a numeric string counts); else the last tag
`<score_key>:<number>` (a feedback tag such as `score:4`). Feedback is read only under `score`,
the name of its field: a build that scores by another key (`judge`, on a scale of its own) is
not mixed with feedback on another scale. A sample with no score is removed with reason
"no_score": asking for a threshold means unscored samples are unknown quality, not good ones.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping

from services.ingest.datasets.cleaning.report import StepReport
from services.ingest.samples.feedback.store import SCORE_KEY as FEEDBACK_SCORE_KEY
from shared.chat import Sample


def _number(value: object) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def sample_score(
    sample: Sample, key: str, feedback: Mapping[str, float] | None = None
) -> float | None:
    """`feedback`: each sample id's newest feedback score (feedback.store.newest_scores)."""
    if key == FEEDBACK_SCORE_KEY and feedback and (score := feedback.get(sample.id)) is not None:
        return score
    if (score := _number(sample.metadata.get(key))) is not None:
        return score
    prefix = f"{key}:"
    for tag in reversed(sample.tags):
        if tag.startswith(prefix) and (score := _number(tag[len(prefix) :])) is not None:
            return score
    return None


def filter_by_score(
    samples: list[Sample],
    min_score: float,
    key: str,
    feedback: Mapping[str, float] | None = None,
) -> tuple[list[Sample], StepReport]:
    kept: list[Sample] = []
    removed: Counter[str] = Counter()
    for sample in samples:
        score = sample_score(sample, key, feedback)
        if score is None:
            removed["no_score"] += 1
        elif score < min_score:
            removed["below_min_score"] += 1
        else:
            kept.append(sample)
    return kept, StepReport.of("min_score", len(samples), removed)

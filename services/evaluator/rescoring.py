"""Re-scoring before the final choice: which checkpoints, on which items, and the combined score.

The top checkpoints by subset score are scored on the whole eval split, up to a bound, so that
the noise of a small subset does not pick the winner, on the scores that choose: the judge's,
or the deterministic graders' (every other job, and a judged job whose choice fell back to
them). The whole split's first items in the subset's own order (sha256 of version and sample
id) are the subset itself; those answers were generated at temperature 0 and are reused, so only
the rest of the split is generated. Each re-score is stored once made, so a restart re-scores
only what is left.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

from sqlalchemy.engine import Engine as DbEngine

from services.evaluator import records
from services.evaluator.decision import Rescored
from services.evaluator.engine_client import HosterRefused
from services.evaluator.models import EvalJobRow, EvalRescoreRow
from services.evaluator.subset import EvalItem, SubsetError, item_of, pick, read_eval_split
from shared.storage import ObjectStore

log = logging.getLogger("tuneloop.evaluator")
# Whose scores a re-score is on (EvalRescoreRow.grader).
JUDGE, DETERMINISTIC = "judge", "deterministic"
# Generate and grade `items` at a checkpoint's step and store the outputs: (each item's score,
# the outputs' URI).
ScoreRest = Callable[[int, list[EvalItem]], Awaitable[tuple[list[float], str]]]
# A step's subset answers that ended as judge_error, asked again: their scores by position.
Reask = Callable[[int], Awaitable[dict[int, float]]]


def candidates(scores: dict[int, float], top: int) -> list[int]:
    """The `top` steps by score (the earlier step first among equals); none when re-scoring
    cannot change the choice (fewer than two checkpoints, or `top` under two)."""
    if top < 2 or len(scores) < 2:
        return []
    return sorted(scores, key=lambda s: (-scores[s], s))[:top]


def rest_of_split(
    store: ObjectStore,
    *,
    dataset_uri: str,
    dataset_version: str,
    subset_ids: set[str],
    max_items: int,
) -> list[EvalItem]:
    """The items of the whole split (its first `max_items`) that the subset does not hold,
    numbered after it. A sample that cannot be sent as a prompt is left out, as the subset
    leaves it out. SubsetError when the split cannot be read; StorageError passes through."""
    chosen = pick(read_eval_split(store, dataset_uri), size=max_items, seed=dataset_version)
    rest: list[EvalItem] = []
    for sample in chosen:
        if sample.id in subset_ids:
            continue
        try:
            rest.append(item_of(len(subset_ids) + len(rest), sample))
        except SubsetError:
            continue
    return rest


def verdict_scores(results: Iterable[tuple[float, dict[str, Any]]]) -> list[float]:
    """The item scores a mean counts: an item the judge could not score (`judge_error`: no
    verdict) is left out, as the judge's own mean leaves it out, rather than counted as 0."""
    return [score for score, detail in results if "judge_error" not in detail]


def deterministic_scores(results: Iterable[tuple[float, dict[str, Any]]]) -> list[float]:
    """Every item's deterministic grade: kept beside the verdict on a judged item (its detail's
    `deterministic`), the score itself on any other."""
    return [float(detail.get("deterministic", {}).get("score", score)) for score, detail in results]


def subset_scores(grader: str, results: Iterable[tuple[float, dict[str, Any]]]) -> list[float]:
    return (deterministic_scores if grader == DETERMINISTIC else verdict_scores)(results)


def combined(subset_scores: Sequence[float], rest_scores: Sequence[float]) -> float:
    """The mean over the whole split: the subset's item scores and the rest's together."""
    total = len(subset_scores) + len(rest_scores)
    return (sum(subset_scores) + sum(rest_scores)) / total if total else 0.0


async def rescore(
    db: DbEngine,
    store: ObjectStore,
    job: EvalJobRow,
    scores: dict[int, float],
    *,
    top: int,
    max_items: int,
    score_rest: ScoreRest,
    grader: str = DETERMINISTIC,
    grader_words: str = "",
    reask: Reask | None = None,
) -> Rescored | None:
    """The top checkpoints by `scores` on the whole split, on `grader`'s scores (the judge's,
    or the deterministic ones: `score_rest` grades the rest so); a note saying why not when it
    cannot be done; None when re-scoring could not change the choice. `grader_words` names the
    grader in the decision's text (Rescored.grader); `reask` asks the judge again about the
    subset's judge_errors."""
    steps = candidates(scores, top)
    if not steps:
        return None
    subset = await asyncio.to_thread(records.items, db, job.job_id)
    try:
        rest = await asyncio.to_thread(
            rest_of_split,
            store,
            dataset_uri=job.dataset_uri,
            dataset_version=job.dataset_version,
            subset_ids={item.sample_id for item in subset},
            max_items=max_items,
        )
    except SubsetError as exc:
        return Rescored(note=f"Not re-scored on the whole eval split: {exc}.")
    if not rest:
        return Rescored(note=f"No re-scoring: the subset ({len(subset)} items) is the whole split.")
    stored = await asyncio.to_thread(records.rescores, db, job.job_id)
    done = {r.step: r for r in stored if r.grader == grader}
    try:
        for step in steps:
            if step not in done:
                done[step] = await _rescore_one(
                    db, job.job_id, step, rest, score_rest, grader, reask
                )
    except HosterRefused as exc:
        return Rescored(note=f"Not re-scored on the whole eval split: {exc}.")
    return Rescored(
        items=len(subset) + len(rest),
        subset_items=len(subset),
        scores={s: done[s].score for s in steps},
        grader=grader_words,
    )


async def _rescore_one(
    db: DbEngine, job_id: str, step: int, rest: list[EvalItem], score_rest: ScoreRest,
    grader: str, reask: Reask | None,
) -> EvalRescoreRow:  # fmt: skip
    started = time.monotonic()
    rest_scores, uri = await score_rest(step, rest)
    subset = await asyncio.to_thread(records.results, db, job_id, step)
    # The judge's subset answers that had no verdict are asked again: a judge_error is no
    # result to reuse (the endpoint may be back); one failing again is left out as before.
    answered = await reask(step) if reask is not None and grader == JUDGE else {}
    counted = subset_scores(grader, ((r.score, json.loads(r.detail)) for _, r in subset))
    counted += list(answered.values())
    row = EvalRescoreRow(
        job_id=job_id,
        step=step,
        score=combined(counted, rest_scores),
        items=len(counted) + len(rest_scores),
        outputs_uri=uri,
        duration_s=time.monotonic() - started,
        grader=grader,
    )
    await asyncio.to_thread(records.store_rescore, db, row)
    log.info(
        "job %s: re-scored step %d on %d items: %.3f in %.1fs",
        job_id, step, row.items, row.score, row.duration_s,
    )  # fmt: skip
    return row

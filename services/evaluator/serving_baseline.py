"""Beats the serving version: before an auto-deployed version becomes its served name's canary,
the version serving that name now is scored on the same eval items as the job's best checkpoint.

The served name is the job's suffix (`ft:<base>:<suffix>:<job>`), as the hoster deploys it. The
items are those `best_score` was measured on: the whole eval split up to `RESCORE_MAX_ITEMS` when
the top checkpoints were re-scored, else the job's subset. Generation is at temperature 0 on an
eval engine (the serving version's checkpoint loaded as any checkpoint is) and the grading is the
decision's own: the same graders, the judge's verdicts when the judge chose, the deterministic
grades when the choice fell back to them. The rule: the new version beats the serving one when
its mean is at least the serving mean + `SERVING_MARGIN`. The hoster reads `beats_serving` from
`eval.decided`; the decision's text says it in words, which the scheduler shows as a job event.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

from sqlalchemy.engine import Engine as DbEngine

from services.evaluator import records, rescoring
from services.evaluator.decision import Decision
from services.evaluator.engine_client import HosterClient, HosterRefused, Serving
from services.evaluator.models import EvalJobRow, EvalServingRow
from services.evaluator.scoring import ItemResult
from services.evaluator.subset import EvalItem
from shared.ft_names import job_suffix
from shared.storage import ObjectStore

log = logging.getLogger("tuneloop.evaluator")
_EPSILON = 1e-9  # float error: 0.8 + 0.05 must accept 0.85, as the gate does
# Generate and grade `items` with the serving version: (the graded results, the outputs' URI).
ScoreServing = Callable[[Serving, list[EvalItem]], Awaitable[tuple[list[ItemResult], str]]]


def beats(new: float, serving: float, margin: float) -> bool:
    """The new version's mean is at least the serving version's plus `margin`."""
    return new + _EPSILON >= serving + margin


def scores_on_scale(results: Sequence[ItemResult], *, deterministic: bool) -> list[float]:
    """The item scores the decision's mean counts: the deterministic grades when a judged
    job's choice fell back to them (kept in each verdict's detail), else each item's score
    with the judge's errors left out, as re-scoring leaves them out."""
    if deterministic:
        return [
            float(r.detail["deterministic"]["score"]) if "deterministic" in r.detail else r.score
            for r in results
        ]
    return rescoring.verdict_scores((r.score, r.detail) for r in results)


def served_label(serving: Serving) -> str:
    if serving.version is not None:
        return f"v{serving.version} ({serving.version_id})"
    return serving.version_id or serving.model


def describe(
    *, new: float, serving: float, items: int, label: str, name: str, margin: float, won: bool
) -> str:
    """The comparison in words, for the job's events."""
    said = (
        f"The new version scored {new:.3f} on {items} eval items; the serving version {label} "
        f"of {name!r} scored {serving:.3f}"
    )
    bar = f" + the margin {margin:.2f}" if margin else ""
    if won:
        return f"{said}: it is deployed as the canary of {name!r}."
    return (
        f"{said}: not deployed as a canary (it must score at least the serving version's "
        f"score{bar})."
    )


async def items_for(
    db: DbEngine, store: ObjectStore, job: EvalJobRow, made: Decision, *, max_items: int
) -> list[EvalItem]:
    """The items `made.best_score` was measured on: the subset, and the rest of the split
    when the top checkpoints were re-scored on it."""
    subset = await asyncio.to_thread(records.items, db, job.job_id)
    if not made.rescored:
        return subset
    rest = await asyncio.to_thread(
        rescoring.rest_of_split,
        store,
        dataset_uri=job.dataset_uri,
        dataset_version=job.dataset_version,
        subset_ids={item.sample_id for item in subset},
        max_items=max_items,
    )
    return subset + rest


async def compare(
    db: DbEngine,
    store: ObjectStore,
    job: EvalJobRow,
    made: Decision,
    serving: Serving,
    *,
    name: str,
    margin: float,
    max_items: int,
    score: ScoreServing,
) -> Decision:
    """`made` with the serving version's score on the same items, whether the new version beats
    it, and the comparison appended to its text. Scored once per (job, version) and stored, so
    a restart before the decision is stored scores nothing again."""
    assert made.best_score is not None
    served = serving.version_id or serving.model  # a catalogue base: its id
    row = await asyncio.to_thread(records.serving_baseline, db, job.job_id, served)
    if row is None:
        started = time.monotonic()
        items = await items_for(db, store, job, made, max_items=max_items)
        results, uri = await score(serving, items)
        counted = scores_on_scale(results, deterministic=made.judge_fallback)
        row = EvalServingRow(
            job_id=job.job_id,
            version_id=served,
            version=serving.version,
            model=serving.model,
            checkpoint_uri=serving.checkpoint_uri or "",
            score=sum(counted) / len(counted) if counted else 0.0,
            items=len(counted),
            outputs_uri=uri,
            duration_s=time.monotonic() - started,
        )
        await asyncio.to_thread(records.store_serving_baseline, db, row)
        log.info(
            "job %s: serving version %s of %r scored %.3f on %d items in %.1fs",
            job.job_id, serving.version_id, name, row.score, row.items, row.duration_s,
        )  # fmt: skip
    won = beats(made.best_score, row.score, margin)
    text = describe(
        new=made.best_score, serving=row.score, items=row.items, label=served_label(serving),
        name=name, margin=margin, won=won,
    )  # fmt: skip
    return dataclasses.replace(
        made,
        gate_reason=f"{made.gate_reason} {text}".strip(),
        serving_version_id=serving.version_id,
        serving_score=row.score,
        serving_items=row.items,
        beats_serving=won,
    )


async def against_serving(
    db: DbEngine,
    store: ObjectStore,
    hoster: HosterClient,
    job: EvalJobRow,
    made: Decision,
    *,
    margin: float,
    max_items: int,
    score: ScoreServing,
) -> Decision:
    """For an auto-deploying job that passed its gate and whose served name (its suffix) has a
    primary: `made` compared with that primary; any other decision as it is."""
    name = job_suffix(job.fine_tuned_model)
    if not job.auto_deploy or made.gate != "passed" or made.best_score is None or not name:
        return made
    serving = await hoster.serving(job.tenant, name)
    if serving is None:
        return made
    try:
        return await compare(
            db, store, job, made, serving,
            name=name, margin=margin, max_items=max_items, score=score,
        )  # fmt: skip
    except HosterRefused as exc:
        # Unmeasured is not better: the hoster registers it without making it the canary.
        text = (
            f"The serving version {served_label(serving)} of {name!r} could not be scored "
            f"({exc}): not deployed as a canary."
        )
        log.warning("job %s: %s", job.job_id, text)
        return dataclasses.replace(
            made, gate_reason=f"{made.gate_reason} {text}".strip(),
            serving_version_id=serving.version_id, beats_serving=False,
        )  # fmt: skip

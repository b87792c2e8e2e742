"""Versions side by side: two completed runs of one eval over the same items (typically two
`completions` runs, one per model: an `ft:` version, a served name, an upstream model), item by
item, with the score and latency of each and the candidate's regressions first.

An item's score is the mean of its criteria's scores; the delta is the candidate's minus the
base's. An item one run could not grade (status `error`: the model did not answer, a reference
was missing, a judge_error) has no score there and so no delta: it is listed after the
regressions, those the candidate errored on first, since a reviewer reads them as regressions
too. The response model is declared here rather than in protocol.py: OpenAI has no such route.
"""

from __future__ import annotations

import asyncio
import json
import statistics
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, Field
from sqlalchemy.engine import Engine

from services.evaluator import templating
from services.evaluator.evals import store
from services.evaluator.evals.errors import EvalsError, not_found
from services.evaluator.models import EvalsOutputItemRow, EvalsRunRow

Change = Literal["regressed", "errored", "unchanged", "improved"]
_RANK: dict[Change, int] = {"regressed": 0, "errored": 1, "unchanged": 2, "improved": 3}


class Grade(BaseModel):
    name: str
    score: float
    passed: bool
    error: str | None = Field(default=None, description="why this criterion could not grade")


class Side(BaseModel):
    """One run's output item for the compared item."""

    output_item_id: str
    status: Literal["pass", "fail", "error"]
    output_text: str = Field(description="the answer's text ('' when there is none)")
    error: str | None = Field(description="why the item errored: the model's or a grader's")
    results: list[Grade]
    score: float | None = Field(description="mean of the criteria's scores; null when errored")
    latency_ms: float | None = Field(
        description="wall time of the model's call; null for a jsonl run or when none went out"
    )


class ComparedItem(BaseModel):
    datasource_item_id: int
    datasource_item: dict[str, Any]
    change: Change
    delta: float | None = Field(description="candidate's score minus base's; null when either "
                                "errored")  # fmt: skip
    base: Side
    candidate: Side


class RunSummary(BaseModel):
    id: str
    name: str
    model: str | None
    items: int
    errored: int
    mean_score: float | None = Field(description="mean item score over the items not errored")
    mean_per_criterion: dict[str, float | None] = Field(
        description="each criterion's mean score over the items it could grade"
    )
    pass_rate: float = Field(description="share of items that passed every criterion")
    latency_p50_ms: float | None
    latency_p95_ms: float | None


class ChangeCounts(BaseModel):
    regressed: int
    errored: int
    unchanged: int
    improved: int


class Comparison(BaseModel):
    object: Literal["eval.comparison"] = "eval.comparison"
    eval_id: str
    base: RunSummary
    candidate: RunSummary
    counts: ChangeCounts
    data: list[ComparedItem] = Field(
        description="regressions (most negative delta first), errored items (the candidate's "
        "errors first), unchanged, improvements (smallest first); by item within each"
    )
    first_id: int | None = Field(description="datasource_item_id of the page's first item")
    last_id: int | None = Field(description="datasource_item_id of the page's last item")
    has_more: bool


# --- the work ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Run:
    row: EvalsRunRow
    items: list[EvalsOutputItemRow]


def _load(engine: Engine, tenant: str, eval_id: str, base: str, candidate: str) -> list[_Run]:
    """Both runs with their items (blocking); 404 / 409 naming the run that cannot be used."""
    if store.get_eval(engine, tenant, eval_id) is None:
        raise not_found("eval", eval_id, "eval_id")
    runs = []
    for role, run_id in (("base", base), ("candidate", candidate)):
        row = store.get_run(engine, tenant, eval_id, run_id)
        if row is None:
            raise not_found(f"run of eval {eval_id}", run_id, role)
        if row.status != "completed":
            raise EvalsError(409, f"{role}: run {run_id} is {row.status}; only completed runs "
                             "are compared", param=role, code="run_not_completed")  # fmt: skip
        runs.append(_Run(row, store.graded_items(engine, run_id)))
    return runs


def _canonical(row: EvalsOutputItemRow) -> str:
    return json.dumps(store.loads(row.item), sort_keys=True, separators=(",", ":"))


def _check_same_items(base: _Run, candidate: _Run) -> None:
    """The runs must have answered the same items in the same order, compared by content."""
    left, right = base.items, candidate.items
    if len(left) != len(right):
        raise EvalsError(
            409, f"candidate: run {candidate.row.id} has {len(right)} items and run "
            f"{base.row.id} {len(left)}; only runs over the same items are compared",
            param="candidate", code="items_differ",
        )  # fmt: skip
    for one, other in zip(left, right, strict=True):
        if _canonical(one) != _canonical(other):
            raise EvalsError(
                409, f"candidate: item {one.position} of run {candidate.row.id} is not item "
                f"{one.position} of run {base.row.id}; only runs over the same items are "
                "compared", param="candidate", code="items_differ",
            )  # fmt: skip


def _side(row: EvalsOutputItemRow, timed: bool) -> Side:
    sample: dict[str, Any] = store.loads(row.sample) or {}
    results = [Grade(**{k: r.get(k) for k in Grade.model_fields}) for r in store.loads(row.results)]
    model_error = sample.get("error")
    error = model_error.get("message") if isinstance(model_error, dict) else None
    error = error or next((r.error for r in results if r.error), None)
    latency = sample.get("latency_ms") if timed else None
    text = templating.sample_context(sample)["output_text"]
    return Side(
        output_item_id=row.id,
        status=row.status,  # graded: pass, fail or error
        output_text=text if isinstance(text, str) else "",
        error=error if row.status == "error" else None,
        results=results,
        score=None if row.status == "error" else statistics.fmean(r.score for r in results),
        latency_ms=float(latency) if isinstance(latency, int | float) else None,
    )


def _compared(base: EvalsOutputItemRow, candidate: EvalsOutputItemRow, timed: tuple[bool, bool]
              ) -> ComparedItem:  # fmt: skip
    left, right = _side(base, timed[0]), _side(candidate, timed[1])
    delta = None if left.score is None or right.score is None else right.score - left.score
    change: Change
    if delta is None:
        change = "errored"
    else:
        change = "regressed" if delta < 0 else "improved" if delta > 0 else "unchanged"
    return ComparedItem(
        datasource_item_id=base.position, datasource_item=store.loads(base.item),
        change=change, delta=delta, base=left, candidate=right,
    )  # fmt: skip


def _order(item: ComparedItem) -> tuple[int, float, int]:
    if item.delta is not None:
        return (_RANK[item.change], item.delta, item.datasource_item_id)
    # Errored: the candidate's own errors first, then the base's, then both.
    both = item.base.score is None and item.candidate.score is None
    which = 2 if both else 1 if item.base.score is None else 0
    return (_RANK["errored"], which, item.datasource_item_id)


def _percentile(values: list[float], q: float) -> float | None:
    """Nearest rank: a latency some item really had."""
    return float(np.percentile(values, q, method="inverted_cdf")) if values else None


def _summary(run: EvalsRunRow, sides: list[Side]) -> RunSummary:
    scores = [s.score for s in sides if s.score is not None]
    names = [r.name for r in sides[0].results] if sides else []
    per_criterion = {}
    for index, name in enumerate(names):
        graded = [s.results[index].score for s in sides if s.results[index].error is None]
        per_criterion[name] = statistics.fmean(graded) if graded else None
    latencies = [s.latency_ms for s in sides if s.latency_ms is not None]
    return RunSummary(
        id=run.id, name=run.name, model=run.model, items=len(sides),
        errored=sum(s.status == "error" for s in sides),
        mean_score=statistics.fmean(scores) if scores else None,
        mean_per_criterion=per_criterion,
        pass_rate=sum(s.status == "pass" for s in sides) / len(sides) if sides else 0.0,
        latency_p50_ms=_percentile(latencies, 50), latency_p95_ms=_percentile(latencies, 95),
    )  # fmt: skip


def comparison(
    engine: Engine, tenant: str, eval_id: str, *, base: str, candidate: str,
    after: int | None, limit: int,
) -> Comparison:  # fmt: skip
    """The comparison's page after item `after` (blocking: run it in a thread)."""
    left, right = _load(engine, tenant, eval_id, base, candidate)
    _check_same_items(left, right)
    # Only a completions run timed its calls; a jsonl run's sample is as the caller gave it.
    timed = (left.row.model is not None, right.row.model is not None)
    items = sorted(
        (_compared(b, c, timed) for b, c in zip(left.items, right.items, strict=True)), key=_order
    )
    start = 0
    if after is not None:
        ids = [item.datasource_item_id for item in items]
        if after not in ids:
            raise not_found("compared item", str(after), "after")
        start = ids.index(after) + 1
    page = items[start : start + limit]
    counts = {change: sum(i.change == change for i in items) for change in _RANK}
    return Comparison(
        eval_id=eval_id,
        base=_summary(left.row, [i.base for i in items]),
        candidate=_summary(right.row, [i.candidate for i in items]),
        counts=ChangeCounts(**counts),
        data=page,
        first_id=page[0].datasource_item_id if page else None,
        last_id=page[-1].datasource_item_id if page else None,
        has_more=start + limit < len(items),
    )


async def compare(
    engine: Engine, tenant: str, eval_id: str, *, base: str, candidate: str,
    after: int | None, limit: int,
) -> Comparison:  # fmt: skip
    return await asyncio.to_thread(
        comparison, engine, tenant, eval_id,
        base=base, candidate=candidate, after=after, limit=limit,
    )  # fmt: skip

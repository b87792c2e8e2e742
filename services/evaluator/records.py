"""Reads and writes of the evaluator's tables, one short transaction each (blocking: callers on the
event loop run them in a thread). Every write is idempotent, since events may arrive twice."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy.engine import Engine
from sqlmodel import col, delete, select

from services.evaluator.graders import Answer
from services.evaluator.models import (
    EvalItemRow,
    EvalJobRow,
    EvalPointRow,
    EvalRescoreRow,
    EvalResultRow,
    EvalServingRow,
)
from services.evaluator.scoring import ItemResult
from services.evaluator.subset import EvalItem
from shared.db import session_scope, utcnow
from shared.events import JobPlanned


def get_job(engine: Engine, job_id: str) -> EvalJobRow | None:
    with session_scope(engine) as session:
        return session.get(EvalJobRow, job_id)


def create_job(
    engine: Engine, event: JobPlanned, items: list[EvalItem], eval_error: str | None
) -> bool:
    """Store the plan and its subset; False (nothing changed) when the job is already known."""
    with session_scope(engine) as session:
        if session.get(EvalJobRow, event.job_id) is not None:
            return False
        session.add(
            EvalJobRow(
                job_id=event.job_id,
                tenant=event.tenant,
                base_model=event.base_model,
                fine_tuned_model=event.fine_tuned_model,
                dataset_id=event.dataset_id,
                dataset_version=event.dataset_version,
                dataset_uri=event.dataset_uri,
                task_kind=event.task_kind,
                steps=event.steps,
                eval_every=event.eval_every,
                eval_items=event.eval_items,
                auto_deploy=event.auto_deploy,
                eval_error=eval_error,
            )
        )
        session.add_all(_item_row(event.job_id, item) for item in items)
        return True


def _item_row(job_id: str, item: EvalItem) -> EvalItemRow:
    prompt = {"messages": item.messages, "tools": item.tools}
    reference = {
        "text": item.reference.text,
        "tool_calls": [list(c) for c in item.reference.tool_calls],
    }
    return EvalItemRow(
        job_id=job_id,
        position=item.position,
        sample_id=item.sample_id,
        prompt=json.dumps(prompt).encode(),
        reference=json.dumps(reference).encode(),
        max_tokens=item.max_tokens,
    )


def items(engine: Engine, job_id: str) -> list[EvalItem]:
    with session_scope(engine) as session:
        rows = session.exec(
            select(EvalItemRow)
            .where(EvalItemRow.job_id == job_id)
            .order_by(col(EvalItemRow.position))
        ).all()
    out = []
    for row in rows:
        prompt, reference = json.loads(row.prompt), json.loads(row.reference)
        answer = Answer(reference["text"], tuple((n, a) for n, a in reference["tool_calls"]))
        out.append(
            EvalItem(
                row.position,
                row.sample_id,
                prompt["messages"],
                prompt["tools"],
                answer,
                row.max_tokens,
            )
        )
    return out


def update_job(engine: Engine, job_id: str, **values: Any) -> None:
    with session_scope(engine) as session:
        row = session.get(EvalJobRow, job_id)
        if row is None:
            raise LookupError(f"job {job_id}: not planned here")
        for name, value in values.items():
            setattr(row, name, value)


def add_point(
    engine: Engine, job_id: str, step: int, uri: str, train_loss: float | None = None
) -> bool:
    """Record a saved checkpoint; False when it was recorded before (its uri is kept; its train
    loss is filled in if it had none)."""
    with session_scope(engine) as session:
        point = session.get(EvalPointRow, (job_id, step))
        if point is not None:
            if point.train_loss is None and train_loss is not None:
                point.train_loss = train_loss
            return False
        session.add(
            EvalPointRow(job_id=job_id, step=step, checkpoint_uri=uri, train_loss=train_loss)
        )
        return True


def points(engine: Engine, job_id: str) -> list[EvalPointRow]:
    with session_scope(engine) as session:
        return list(
            session.exec(
                select(EvalPointRow)
                .where(EvalPointRow.job_id == job_id)
                .order_by(col(EvalPointRow.step))
            ).all()
        )


def _replace_results(session: Any, job_id: str, step: int, results: list[ItemResult]) -> None:
    session.exec(
        delete(EvalResultRow).where(
            col(EvalResultRow.job_id) == job_id, col(EvalResultRow.step) == step
        )
    )
    for r in results:
        session.add(
            EvalResultRow(
                job_id=job_id,
                step=step,
                position=r.item.position,
                output=r.output.answer.text,
                tool_calls=json.dumps([list(c) for c in r.output.answer.tool_calls]).encode(),
                score=r.score,
                detail=json.dumps(r.detail, default=str).encode(),
                latency_ms=r.output.latency_ms,
                error=r.output.error[:2000] if r.output.error else None,
            )
        )


def store_base(
    engine: Engine, job_id: str, step: int, results: list[ItemResult], score: float, uri: str
) -> None:
    with session_scope(engine) as session:
        _replace_results(session, job_id, step, results)
        job = session.get(EvalJobRow, job_id)
        assert job is not None
        job.base_score, job.base_outputs_uri = score, uri


def store_point(
    engine: Engine,
    job_id: str,
    step: int,
    results: list[ItemResult],
    *,
    score: float,
    uri: str,
    duration_s: float,
    best_changed: bool,
) -> None:
    with session_scope(engine) as session:
        _replace_results(session, job_id, step, results)
        point = session.get(EvalPointRow, (job_id, step))
        assert point is not None
        point.score, point.outputs_uri, point.duration_s = score, uri, duration_s
        point.best_changed, point.scored_at = best_changed, utcnow()


def mark_published(engine: Engine, job_id: str, step: int) -> None:
    with session_scope(engine) as session:
        point = session.get(EvalPointRow, (job_id, step))
        assert point is not None
        point.published = True


def rescores(engine: Engine, job_id: str) -> list[EvalRescoreRow]:
    with session_scope(engine) as session:
        return list(
            session.exec(select(EvalRescoreRow).where(EvalRescoreRow.job_id == job_id)).all()
        )


def store_rescore(engine: Engine, row: EvalRescoreRow) -> None:
    """Store a re-score; one stored before for the same step is replaced."""
    with session_scope(engine) as session:
        session.merge(row)


def serving_baseline(engine: Engine, job_id: str, version_id: str) -> EvalServingRow | None:
    with session_scope(engine) as session:
        return session.get(EvalServingRow, (job_id, version_id))


def store_serving_baseline(engine: Engine, row: EvalServingRow) -> None:
    with session_scope(engine) as session:
        session.merge(row)


def judge_errors(engine: Engine, job_id: str) -> dict[int, int]:
    """How many answers at each scored point (BASE_STEP: the base) the judge could not grade
    (`judge_error` in their detail): left out of that point's mean."""
    with session_scope(engine) as session:
        rows = session.exec(
            select(EvalResultRow.step, EvalResultRow.detail).where(EvalResultRow.job_id == job_id)
        ).all()
    counts: dict[int, int] = {}
    for step, detail in rows:
        counts[step] = counts.get(step, 0) + (b'"judge_error"' in detail)
    return counts


def results(engine: Engine, job_id: str, step: int) -> list[tuple[EvalItemRow, EvalResultRow]]:
    with session_scope(engine) as session:
        rows = session.exec(
            select(EvalItemRow, EvalResultRow)
            .where(EvalResultRow.job_id == job_id, EvalResultRow.step == step)
            .where(EvalItemRow.job_id == EvalResultRow.job_id)
            .where(EvalItemRow.position == EvalResultRow.position)
            .order_by(col(EvalResultRow.position))
        ).all()
        return [(item, result) for item, result in rows]

"""Reads and writes of the judge's tables: rubric versions, the verdict cache, which jobs the
judge grades, and people's labels. One short transaction each (blocking: callers on the event
loop run them in a thread); writes are idempotent where an event may repeat them."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlmodel import col, select

from services.evaluator.models import JudgeJobRow, JudgeLabelRow, JudgeRubricRow, JudgeVerdictRow
from services.evaluator.rubric import Rubric
from shared.db import session_scope, utcnow


def rubric_id(dataset_version: str, version: int) -> str:
    """How a verdict names the rubric it used, e.g. `dsv-1a2b@3`."""
    return f"{dataset_version}@{version}"


# --- rubrics -------------------------------------------------------------------------------------


def latest_rubric(engine: Engine, tenant: str, dataset_version: str) -> JudgeRubricRow | None:
    with session_scope(engine) as session:
        return session.exec(
            select(JudgeRubricRow)
            .where(JudgeRubricRow.tenant == tenant)
            .where(JudgeRubricRow.dataset_version == dataset_version)
            .order_by(col(JudgeRubricRow.version).desc())
        ).first()


def rubric_versions(engine: Engine, tenant: str, dataset_version: str) -> list[JudgeRubricRow]:
    with session_scope(engine) as session:
        return list(
            session.exec(
                select(JudgeRubricRow)
                .where(JudgeRubricRow.tenant == tenant)
                .where(JudgeRubricRow.dataset_version == dataset_version)
                .order_by(col(JudgeRubricRow.version))
            ).all()
        )


def get_rubric(
    engine: Engine, tenant: str, dataset_version: str, version: int
) -> JudgeRubricRow | None:
    with session_scope(engine) as session:
        return session.get(JudgeRubricRow, (tenant, dataset_version, version))


def add_rubric(
    engine: Engine,
    *,
    tenant: str,
    dataset_version: str,
    rubric: Rubric,
    source: str,
    note: str | None = None,
    judge_model: str | None = None,
    after: int | None = None,
) -> JudgeRubricRow:
    """Store the next version. `after`: the version this one replaces (None: the first); when
    another writer got there first the insert fails and that version is returned instead of
    adding a duplicate (two evaluators writing the first rubric at once)."""
    version = (after or 0) + 1
    row = JudgeRubricRow(
        tenant=tenant,
        dataset_version=dataset_version,
        version=version,
        source=source,
        body=rubric.model_dump_json().encode(),
        note=note,
        judge_model=judge_model,
    )
    try:
        with session_scope(engine) as session:
            session.add(row)
    except IntegrityError:
        existing = get_rubric(engine, tenant, dataset_version, version)
        assert existing is not None
        return existing
    stored = get_rubric(engine, tenant, dataset_version, version)
    assert stored is not None
    return stored


def rubric_of(row: JudgeRubricRow) -> Rubric:
    return Rubric.model_validate_json(row.body)


# --- the verdict cache ---------------------------------------------------------------------------


class DbVerdictCache:
    """judge.VerdictCache on evaluator_judge_verdicts."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def get(self, key: str) -> dict[str, Any] | None:
        with session_scope(self.engine) as session:
            row = session.get(JudgeVerdictRow, key)
            return None if row is None else dict(json.loads(row.verdict))

    def put(
        self, key: str, *, tenant: str, model: str, rubric: str, verdict: dict[str, Any]
    ) -> None:
        try:
            with session_scope(self.engine) as session:
                if session.get(JudgeVerdictRow, key) is None:
                    session.add(
                        JudgeVerdictRow(
                            key=key,
                            tenant=tenant,
                            model=model[:256],
                            rubric=rubric[:128],
                            verdict=json.dumps(verdict).encode(),
                        )
                    )
        except IntegrityError:
            pass  # the same verdict, stored by a concurrent ask


# --- jobs the judge grades -----------------------------------------------------------------------


def judged_job(engine: Engine, job_id: str) -> JudgeJobRow | None:
    with session_scope(engine) as session:
        return session.get(JudgeJobRow, job_id)


def mark_judged(
    engine: Engine, *, job_id: str, tenant: str, dataset_version: str, model: str
) -> None:
    with session_scope(engine) as session:
        if session.get(JudgeJobRow, job_id) is None:
            session.add(
                JudgeJobRow(
                    job_id=job_id, tenant=tenant, dataset_version=dataset_version, model=model
                )
            )


# --- labels --------------------------------------------------------------------------------------


def put_label(
    engine: Engine,
    *,
    tenant: str,
    dataset_version: str,
    job_id: str,
    step: int,
    position: int,
    kind: str,
    score: float,
    note: str | None,
) -> JudgeLabelRow:
    """Store a person's label on one answer; labelling it again replaces the label."""
    with session_scope(engine) as session:
        row = session.get(JudgeLabelRow, (job_id, step, position))
        if row is None:
            row = JudgeLabelRow(
                job_id=job_id,
                step=step,
                position=position,
                tenant=tenant,
                dataset_version=dataset_version,
                kind=kind,
                score=score,
            )
        row.kind, row.score, row.note, row.updated_at = kind, score, note, utcnow()
        session.add(row)
        session.flush()
        session.refresh(row)
        return row


def delete_label(engine: Engine, job_id: str, step: int, position: int) -> bool:
    with session_scope(engine) as session:
        row = session.get(JudgeLabelRow, (job_id, step, position))
        if row is None:
            return False
        session.delete(row)
        return True


def labels_of_job(engine: Engine, job_id: str) -> list[JudgeLabelRow]:
    with session_scope(engine) as session:
        return list(
            session.exec(
                select(JudgeLabelRow)
                .where(JudgeLabelRow.job_id == job_id)
                .order_by(col(JudgeLabelRow.step), col(JudgeLabelRow.position))
            ).all()
        )


def labels_of(engine: Engine, tenant: str, dataset_version: str) -> list[JudgeLabelRow]:
    """Every label on answers to this dataset version's items, whichever job gave them."""
    with session_scope(engine) as session:
        return list(
            session.exec(
                select(JudgeLabelRow)
                .where(JudgeLabelRow.tenant == tenant)
                .where(JudgeLabelRow.dataset_version == dataset_version)
                .order_by(col(JudgeLabelRow.job_id), col(JudgeLabelRow.step))
            ).all()
        )

"""Reads and writes of the shadow scorer's tables (models.py: evaluator_shadow_targets,
evaluator_shadow_cursors, evaluator_shadow_verdicts). Blocking, one short transaction each:
callers on the event loop run them in a thread. Writes are idempotent: an event or a page of
pairs read twice changes nothing."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Engine
from sqlmodel import col, select

from services.evaluator.models import (
    EvalJobRow,
    JudgeRubricRow,
    ShadowCursorRow,
    ShadowTargetRow,
    ShadowVerdictRow,
)
from shared.db import session_scope, utcnow
from shared.events import ServedNameChanged

# Outcomes of a pair (ShadowVerdictRow.outcome).
SHADOW, PRIMARY, TIE = "shadow", "primary", "tie"
JUDGE_ERROR, SHADOW_FAILED, PRIMARY_FAILED = "judge_error", "shadow_failed", "primary_failed"


@dataclass(frozen=True)
class Tally:
    """A (served name, primary version, shadow version)'s pairs by outcome."""

    name: str
    primary_version: str
    shadow_version: str
    pairs: int = 0
    shadow_wins: int = 0
    primary_wins: int = 0
    ties: int = 0
    judge_errors: int = 0
    shadow_failures: int = 0

    @property
    def decided(self) -> int:
        return self.shadow_wins + self.primary_wins + self.ties


# --- what has a shadow ---------------------------------------------------------------------------


def save_target(engine: Engine, event: ServedNameChanged) -> None:
    """Keep the newest revision of a served name (events may arrive in any order)."""
    with session_scope(engine) as session:
        row = session.get(ShadowTargetRow, (event.tenant, event.name))
        if row is not None and row.revision >= event.revision:
            return
        row = row or ShadowTargetRow(tenant=event.tenant, name=event.name, revision=0)
        row.revision = event.revision
        row.primary_version = event.primary.version_id if event.primary else None
        row.shadow_version = event.shadow.version_id if event.shadow else None
        row.shadow_model = event.shadow.model if event.shadow else None
        row.updated_at = utcnow()
        session.add(row)
        session.commit()


def shadow_tenants(engine: Engine) -> list[str]:
    """Tenants with at least one served name that has a shadow now."""
    with session_scope(engine) as session:
        query = (
            select(ShadowTargetRow.tenant)
            .where(col(ShadowTargetRow.shadow_model).is_not(None))
            .distinct()
        )
        return sorted(session.exec(query).all())


def targets_of(engine: Engine, tenant: str) -> dict[str, ShadowTargetRow]:
    with session_scope(engine) as session:
        rows = session.exec(select(ShadowTargetRow).where(ShadowTargetRow.tenant == tenant))
        return {row.name: row for row in rows}


def target(engine: Engine, tenant: str, name: str) -> ShadowTargetRow | None:
    with session_scope(engine) as session:
        return session.get(ShadowTargetRow, (tenant, name))


def job_rubric(engine: Engine, tenant: str, fine_tuned_model: str) -> JudgeRubricRow | None:
    """The latest rubric of the dataset version the job that made `fine_tuned_model` was
    evaluated on, if that job was judged with one."""
    with session_scope(engine) as session:
        job = session.exec(
            select(EvalJobRow)
            .where(EvalJobRow.tenant == tenant, EvalJobRow.fine_tuned_model == fine_tuned_model)
            .order_by(col(EvalJobRow.created_at).desc())
        ).first()
        if job is None:
            return None
        return session.exec(
            select(JudgeRubricRow)
            .where(JudgeRubricRow.tenant == tenant)
            .where(JudgeRubricRow.dataset_version == job.dataset_version)
            .order_by(col(JudgeRubricRow.version).desc())
        ).first()


# --- cursors and verdicts ------------------------------------------------------------------------


def get_cursor(engine: Engine, tenant: str) -> str | None:
    with session_scope(engine) as session:
        row = session.get(ShadowCursorRow, tenant)
        return row.cursor if row is not None else None


def put_cursor(engine: Engine, tenant: str, cursor: str) -> None:
    with session_scope(engine) as session:
        row = session.get(ShadowCursorRow, tenant) or ShadowCursorRow(tenant=tenant, cursor="")
        row.cursor, row.updated_at = cursor, utcnow()
        session.add(row)
        session.commit()


def judged(engine: Engine, tenant: str, pair_ids: Iterable[str]) -> set[str]:
    """Which of these pairs have a verdict already."""
    ids = list(pair_ids)
    if not ids:
        return set()
    with session_scope(engine) as session:
        query = select(ShadowVerdictRow.pair_id).where(
            ShadowVerdictRow.tenant == tenant, col(ShadowVerdictRow.pair_id).in_(ids)
        )
        return set(session.exec(query).all())


def add_verdicts(engine: Engine, rows: list[ShadowVerdictRow]) -> None:
    """Store verdicts; a pair stored before keeps its first verdict."""
    if not rows:
        return
    with session_scope(engine) as session:
        module = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
        table = ShadowVerdictRow.__table__  # type: ignore[attr-defined]  # SQLModel sets it
        values = [row.model_dump() for row in rows]
        session.execute(module.insert(table).on_conflict_do_nothing(), values)
        session.commit()


def tallies(engine: Engine, tenant: str, name: str) -> list[Tally]:
    """Every (primary version, shadow version) of a served name, with its counts."""
    outcome = col(ShadowVerdictRow.outcome)

    def count(value: str) -> sa.ColumnElement[int]:
        return sa.func.sum(sa.case((outcome == value, 1), else_=0))

    query = (
        sa.select(
            col(ShadowVerdictRow.primary_version),
            col(ShadowVerdictRow.shadow_version),
            sa.func.count(),
            count(SHADOW),
            count(PRIMARY),
            count(TIE),
            count(JUDGE_ERROR),
            count(SHADOW_FAILED),
        )
        .where(col(ShadowVerdictRow.tenant) == tenant, col(ShadowVerdictRow.name) == name)
        .group_by(col(ShadowVerdictRow.primary_version), col(ShadowVerdictRow.shadow_version))
        .order_by(sa.func.max(ShadowVerdictRow.judged_at).desc())
    )
    with session_scope(engine) as session:
        return [
            Tally(name, primary, shadow, *(int(n or 0) for n in counts))
            for primary, shadow, *counts in session.execute(query).all()
        ]


def tally(engine: Engine, tenant: str, name: str, primary: str, shadow: str) -> Tally:
    found = [
        t
        for t in tallies(engine, tenant, name)
        if (t.primary_version, t.shadow_version) == (primary, shadow)
    ]
    return found[0] if found else Tally(name, primary, shadow)

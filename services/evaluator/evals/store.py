"""Reads and writes of the Evals API's tables (services/evaluator/models.py), one short
transaction each; blocking, so callers on the event loop run them in a thread. Every read is
scoped to a tenant: another tenant's eval or run is as absent as one that does not exist."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, Literal, TypeVar

from sqlalchemy.engine import Engine
from sqlmodel import Session, col, delete, select, update

from services.evaluator.models import EvalsEvalRow, EvalsOutputItemRow, EvalsRunRow
from shared.db import session_scope, utcnow

LIVE = ("queued", "in_progress")
JUDGE_ERROR = "judge_error"  # how a result the judge could not grade starts its error
T = TypeVar("T")
Order = Literal["asc", "desc"]


def dumps(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, default=str).encode()


def loads(value: bytes | None) -> Any:
    return json.loads(value) if value is not None else None


@dataclass(frozen=True)
class Page(Generic[T]):
    rows: list[T]
    has_more: bool


# --- evals ------------------------------------------------------------------------------------


def add(engine: Engine, *rows: Any) -> None:
    with session_scope(engine) as session:
        session.add_all(rows)


def get_eval(engine: Engine, tenant: str, eval_id: str) -> EvalsEvalRow | None:
    with session_scope(engine) as session:
        row = session.get(EvalsEvalRow, eval_id)
    return row if row is not None and row.tenant == tenant else None


def _sort_key(row: Any, by: str) -> tuple[datetime, str]:
    return (getattr(row, by), row.id)


def list_evals(
    engine: Engine, tenant: str, *, after: str | None, limit: int, order: Order, order_by: str
) -> Page[EvalsEvalRow] | None:
    """A page of the tenant's evals; None when `after` names none of them."""
    column = col(getattr(EvalsEvalRow, order_by))
    with session_scope(engine) as session:
        query = select(EvalsEvalRow).where(EvalsEvalRow.tenant == tenant)
        if after is not None:
            mark = session.get(EvalsEvalRow, after)
            if mark is None or mark.tenant != tenant:
                return None
            at, ident = _sort_key(mark, order_by)
            ahead = (column > at) | ((column == at) & (col(EvalsEvalRow.id) > ident))
            behind = (column < at) | ((column == at) & (col(EvalsEvalRow.id) < ident))
            query = query.where(ahead if order == "asc" else behind)
        ids = col(EvalsEvalRow.id)
        ordered = (column, ids) if order == "asc" else (column.desc(), ids.desc())
        rows = list(session.exec(query.order_by(*ordered).limit(limit + 1)).all())
    return Page(rows[:limit], len(rows) > limit)


def update_eval(
    engine: Engine, tenant: str, eval_id: str, *, name: str | None, meta: bytes | None
) -> EvalsEvalRow | None:
    with session_scope(engine) as session:
        row = session.get(EvalsEvalRow, eval_id)
        if row is None or row.tenant != tenant:
            return None
        if name is not None:
            row.name = name
        if meta is not None:
            row.meta = meta
        row.updated_at = utcnow()
        return row


def delete_eval(engine: Engine, tenant: str, eval_id: str) -> list[str] | None:
    """Delete the eval with its runs and their items; the ids of its runs that were still
    queued or in progress (their tasks are to be stopped), or None when there is no such eval."""
    with session_scope(engine) as session:
        row = session.get(EvalsEvalRow, eval_id)
        if row is None or row.tenant != tenant:
            return None
        runs = session.exec(select(EvalsRunRow).where(EvalsRunRow.eval_id == eval_id)).all()
        live = [run.id for run in runs if run.status in LIVE]
        _delete_runs(session, [run.id for run in runs])
        session.delete(row)
        return live


def _delete_runs(session: Session, run_ids: list[str]) -> None:
    if run_ids:
        session.exec(delete(EvalsOutputItemRow).where(col(EvalsOutputItemRow.run_id).in_(run_ids)))
        session.exec(delete(EvalsRunRow).where(col(EvalsRunRow.id).in_(run_ids)))


# --- runs -------------------------------------------------------------------------------------


def get_run(engine: Engine, tenant: str, eval_id: str, run_id: str) -> EvalsRunRow | None:
    with session_scope(engine) as session:
        row = session.get(EvalsRunRow, run_id)
    if row is None or row.tenant != tenant or row.eval_id != eval_id:
        return None
    return row


def run_by_id(engine: Engine, run_id: str) -> EvalsRunRow | None:
    with session_scope(engine) as session:
        return session.get(EvalsRunRow, run_id)


def list_runs(
    engine: Engine,
    eval_id: str,
    *,
    after: str | None,
    limit: int,
    order: Order,
    status: str | None,
) -> Page[EvalsRunRow] | None:
    with session_scope(engine) as session:
        query = select(EvalsRunRow).where(EvalsRunRow.eval_id == eval_id)
        if status is not None:
            query = query.where(EvalsRunRow.status == status)
        created, ids = col(EvalsRunRow.created_at), col(EvalsRunRow.id)
        if after is not None:
            mark = session.get(EvalsRunRow, after)
            if mark is None or mark.eval_id != eval_id:
                return None
            at, ident = mark.created_at, mark.id
            ahead = (created > at) | ((created == at) & (ids > ident))
            behind = (created < at) | ((created == at) & (ids < ident))
            query = query.where(ahead if order == "asc" else behind)
        ordered = (created, ids) if order == "asc" else (created.desc(), ids.desc())
        rows = list(session.exec(query.order_by(*ordered).limit(limit + 1)).all())
    return Page(rows[:limit], len(rows) > limit)


def set_status(
    engine: Engine,
    run_id: str,
    status: str,
    *,
    only_from: Iterable[str] = LIVE,
    error: tuple[str, str] | None = None,
) -> EvalsRunRow | None:
    """Move the run to `status` if it is in one of `only_from` (one conditional UPDATE, so a
    cancel and the runner never overwrite each other); the row after, or None when it was not
    (already finished, canceled or deleted)."""
    values: dict[str, Any] = {"status": status}
    if error is not None:
        values["error_code"], values["error_message"] = error[0], error[1][:2000]
    if status not in LIVE:
        values["finished_at"] = utcnow()
    with session_scope(engine) as session:
        moved = session.exec(
            update(EvalsRunRow)
            .where(col(EvalsRunRow.id) == run_id, col(EvalsRunRow.status).in_(list(only_from)))
            .values(**values)
        )
        if moved.rowcount != 1:
            return None
    return run_by_id(engine, run_id)


def delete_run(engine: Engine, tenant: str, eval_id: str, run_id: str) -> EvalsRunRow | None:
    with session_scope(engine) as session:
        row = session.get(EvalsRunRow, run_id)
        if row is None or row.tenant != tenant or row.eval_id != eval_id:
            return None
        _delete_runs(session, [run_id])
        return row


def live_runs(engine: Engine) -> list[EvalsRunRow]:
    with session_scope(engine) as session:
        query = select(EvalsRunRow).where(col(EvalsRunRow.status).in_(LIVE))
        return list(session.exec(query.order_by(col(EvalsRunRow.created_at))).all())


# --- output items -----------------------------------------------------------------------------


def pending_items(engine: Engine, run_id: str, limit: int) -> list[EvalsOutputItemRow]:
    """The next ungraded items, in order."""
    with session_scope(engine) as session:
        query = select(EvalsOutputItemRow).where(
            EvalsOutputItemRow.run_id == run_id, EvalsOutputItemRow.status == "pending"
        )
        query = query.order_by(col(EvalsOutputItemRow.position)).limit(limit)
        return list(session.exec(query).all())


@dataclass(frozen=True)
class Done:
    """One item graded: its sample (None: keep the one it has) and grades."""

    position: int
    status: str
    results: list[dict[str, Any]]
    sample: dict[str, Any] | None = None


def _merge_counts(stored: bytes, added: dict[str, list[int]]) -> bytes:
    counts: dict[str, list[int]] = loads(stored) or {}
    for name, (passed, failed) in added.items():
        before = counts.get(name, [0, 0])
        counts[name] = [before[0] + passed, before[1] + failed]
    return dumps(counts)


def _merge_usage(stored: bytes, added: dict[str, dict[str, int]]) -> bytes:
    usage: dict[str, dict[str, int]] = loads(stored) or {}
    for model, numbers in added.items():
        before = usage.setdefault(model, {})
        for key, value in numbers.items():
            before[key] = before.get(key, 0) + value
    return dumps(usage)


def store_graded(
    engine: Engine, run_id: str, done: list[Done], usage: dict[str, dict[str, int]]
) -> bool:
    """Record a chunk of graded items and add them to the run's counts, in one transaction;
    False (nothing written) when the run is no longer in progress (canceled, deleted)."""
    with session_scope(engine) as session:
        run = session.get(EvalsRunRow, run_id)
        if run is None or run.status != "in_progress":
            return False
        per_criteria: dict[str, list[int]] = {}
        now = utcnow()
        for graded in done:
            row = session.get(EvalsOutputItemRow, (run_id, graded.position))
            if row is None or row.status != "pending":
                continue
            row.status, row.results, row.graded_at = graded.status, dumps(graded.results), now
            if graded.sample is not None:
                row.sample = dumps(graded.sample)
            run.passed += graded.status == "pass"
            run.failed += graded.status == "fail"
            run.errored += graded.status == "error"
            run.judge_errors += any(
                str(result.get("error", "")).startswith(JUDGE_ERROR) for result in graded.results
            )
            for result in graded.results:
                if "error" not in result:
                    counts = per_criteria.setdefault(result["name"], [0, 0])
                    counts[0 if result["passed"] else 1] += 1
        run.per_criteria = _merge_counts(run.per_criteria, per_criteria)
        run.usage = _merge_usage(run.usage, usage)
        return True


def list_items(
    engine: Engine,
    run_id: str,
    *,
    after: str | None,
    limit: int,
    order: Order,
    status: str | None,
) -> Page[EvalsOutputItemRow] | None:
    """A page of the run's graded items (pending ones are not output items yet)."""
    with session_scope(engine) as session:
        query = select(EvalsOutputItemRow).where(
            EvalsOutputItemRow.run_id == run_id, EvalsOutputItemRow.status != "pending"
        )
        if status is not None:
            query = query.where(EvalsOutputItemRow.status == status)
        position = col(EvalsOutputItemRow.position)
        if after is not None:
            mark = _item_by_id(session, after)
            if mark is None or mark.run_id != run_id:
                return None
            query = query.where(
                position > mark.position if order == "asc" else position < mark.position
            )
        ordered = position if order == "asc" else position.desc()
        rows = list(session.exec(query.order_by(ordered).limit(limit + 1)).all())
    return Page(rows[:limit], len(rows) > limit)


def graded_items(engine: Engine, run_id: str) -> list[EvalsOutputItemRow]:
    """Every graded item of the run, in item order (a comparison reads them all)."""
    with session_scope(engine) as session:
        query = select(EvalsOutputItemRow).where(
            EvalsOutputItemRow.run_id == run_id, EvalsOutputItemRow.status != "pending"
        )
        return list(session.exec(query.order_by(col(EvalsOutputItemRow.position))).all())


def _item_by_id(session: Session, item_id: str) -> EvalsOutputItemRow | None:
    return session.exec(select(EvalsOutputItemRow).where(EvalsOutputItemRow.id == item_id)).first()


def get_item(engine: Engine, run_id: str, item_id: str) -> EvalsOutputItemRow | None:
    with session_scope(engine) as session:
        row = _item_by_id(session, item_id)
    if row is None or row.run_id != run_id or row.status == "pending":
        return None
    return row

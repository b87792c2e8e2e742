"""The dataset table's life cycle: create, claim a build, heartbeat, finish, read and list.

A build is claimed with one conditional UPDATE, so two workers handed the same event (a
redelivery while the first still runs) cannot both hold it. The claim is kept alive by
heartbeats; a build whose heartbeat is older than `stale_after_s` belonged to a worker that
died and is taken over by whoever gets the event next.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

import orjson
import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from services.ingest.http.errors import BadRequest
from services.ingest.models import DatasetRow
from shared.db import session_scope, utcnow

ID_PREFIX = "ds_"
STATUSES = ("queued", "building", "built", "failed")
ClaimOutcome = Literal["claimed", "missing", "done", "busy"]


class UnknownAfter(BadRequest, LookupError):
    """`after` (a page's anchor) is not one of the tenant's datasets."""


def new_dataset_id() -> str:
    return f"{ID_PREFIX}{uuid.uuid4().hex[:24]}"


@dataclass(frozen=True)
class Claim:
    outcome: ClaimOutcome
    row: DatasetRow | None = None


@dataclass(frozen=True)
class Built:
    """What a finished build writes on its row."""

    version: str
    uri: str
    train_count: int
    eval_count: int
    stats: dict[str, Any]
    report: dict[str, Any]


def _json(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)


def create(
    session: Session, *, tenant: str, name: str, base_model: str | None, spec: dict[str, Any]
) -> DatasetRow:
    row = DatasetRow(
        id=new_dataset_id(), tenant=tenant, name=name, base_model=base_model, spec=_json(spec)
    )
    session.add(row)
    session.commit()
    session.refresh(row)
    return row


def get(session: Session, *, tenant: str, dataset_id: str) -> DatasetRow | None:
    row = session.get(DatasetRow, dataset_id)
    # Another tenant's dataset is as absent as a missing one.
    return row if row is not None and row.tenant == tenant else None


def delete(engine: Engine, dataset_id: str) -> None:
    with session_scope(engine) as session:
        session.execute(sa.delete(DatasetRow).where(col(DatasetRow.id) == dataset_id))


def list_page(
    session: Session, *, tenant: str, limit: int, after: str | None
) -> tuple[list[DatasetRow], bool]:
    """Newest first, OpenAI style: `after` is the id of the last dataset of the previous page.
    Raises UnknownAfter (a LookupError, 400) when `after` is not one of the tenant's datasets."""
    statement = select(DatasetRow).where(DatasetRow.tenant == tenant)
    if after is not None:
        anchor = get(session, tenant=tenant, dataset_id=after)
        if anchor is None:
            raise UnknownAfter(f"after: dataset {after!r} not found")
        statement = statement.where(
            sa.or_(
                col(DatasetRow.created_at) < anchor.created_at,
                sa.and_(
                    col(DatasetRow.created_at) == anchor.created_at, col(DatasetRow.id) < anchor.id
                ),
            )
        )
    statement = statement.order_by(col(DatasetRow.created_at).desc(), col(DatasetRow.id).desc())
    rows = list(session.exec(statement.limit(limit + 1)))
    return rows[:limit], len(rows) > limit


# --- the build's claim ------------------------------------------------------------------------


def claim(
    engine: Engine, dataset_id: str, *, tenant: str, worker: str, stale_after_s: float
) -> Claim:
    """Take the build for `worker` when it is queued or its last holder went quiet. A dataset
    of another tenant than the event's is as missing as an unknown one."""
    now = utcnow()
    stale = now - timedelta(seconds=stale_after_s)
    takeable = sa.or_(
        col(DatasetRow.status) == "queued",
        sa.and_(
            col(DatasetRow.status) == "building",
            sa.or_(col(DatasetRow.heartbeat_at).is_(None), col(DatasetRow.heartbeat_at) < stale),
        ),
    )
    statement = (
        sa.update(DatasetRow)
        .where(col(DatasetRow.id) == dataset_id, col(DatasetRow.tenant) == tenant, takeable)
        .values(
            status="building",
            claimed_by=worker,
            heartbeat_at=now,
            attempts=DatasetRow.attempts + 1,
            started_at=sa.func.coalesce(DatasetRow.started_at, now),
            # A restarted build starts its progress afresh.
            progress=None,
        )
    )
    with session_scope(engine) as session:
        taken = session.execute(statement).rowcount == 1  # type: ignore[attr-defined]
        session.commit()
        row = session.get(DatasetRow, dataset_id)
    if row is None or row.tenant != tenant:
        return Claim("missing")
    if taken:
        return Claim("claimed", row)
    return Claim("done" if row.status in ("built", "failed") else "busy", row)


def _update_mine(engine: Engine, dataset_id: str, worker: str, **values: Any) -> bool:
    """Update the row only while `worker` holds the build; False when it no longer does."""
    statement = (
        sa.update(DatasetRow)
        .where(
            col(DatasetRow.id) == dataset_id,
            col(DatasetRow.claimed_by) == worker,
            col(DatasetRow.status) == "building",
        )
        .values(**values)
    )
    with session_scope(engine) as session:
        mine = session.execute(statement).rowcount == 1  # type: ignore[attr-defined]
    return bool(mine)


def heartbeat(engine: Engine, dataset_id: str, *, worker: str) -> bool:
    return _update_mine(engine, dataset_id, worker, heartbeat_at=utcnow())


def record_progress(
    engine: Engine, dataset_id: str, *, worker: str, progress: dict[str, Any]
) -> bool:
    return _update_mine(engine, dataset_id, worker, progress=_json(progress), heartbeat_at=utcnow())


def release(engine: Engine, dataset_id: str, *, worker: str) -> bool:
    """Give the build back (a transient failure): the next delivery may claim it at once."""
    return _update_mine(engine, dataset_id, worker, status="queued", claimed_by=None)


def finish_built(engine: Engine, dataset_id: str, *, worker: str, built: Built) -> bool:
    return _update_mine(
        engine,
        dataset_id,
        worker,
        status="built",
        version=built.version,
        uri=built.uri,
        train_count=built.train_count,
        eval_count=built.eval_count,
        stats=_json(built.stats),
        report=_json(built.report),
        error=None,
        finished_at=utcnow(),
    )


def finish_failed(engine: Engine, dataset_id: str, *, worker: str, error: str) -> bool:
    return _update_mine(
        engine, dataset_id, worker, status="failed", error=error[:2000], finished_at=utcnow()
    )


# --- the API's representation ----------------------------------------------------------------


def _timestamp(value: datetime | None) -> int | None:
    return int(value.timestamp()) if value is not None else None


def _loads(value: bytes | None) -> Any:
    return orjson.loads(value) if value is not None else None


def dataset_object(row: DatasetRow) -> dict[str, Any]:
    """A dataset as the API shows it (OpenAI-like: id, object, created_at in unix seconds)."""
    return {
        "id": row.id,
        "object": "dataset",
        "name": row.name,
        "base_model": row.base_model,
        "status": row.status,
        "created_at": _timestamp(row.created_at),
        "started_at": _timestamp(row.started_at),
        "finished_at": _timestamp(row.finished_at),
        "attempts": row.attempts,
        "progress": _loads(row.progress),
        "version": row.version,
        "uri": row.uri,
        "train_count": row.train_count,
        "eval_count": row.eval_count,
        "stats": _loads(row.stats),
        "report": _loads(row.report),
        "error": row.error,
        "spec": _loads(row.spec),
    }

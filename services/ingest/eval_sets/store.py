"""Eval sets: a tenant's named sets of held-out samples, one immutable version per refresh.

This module is the tables' side: create, read, list, write a version, and what every dataset
build asks of them (`hold_out`): the samples any version of any of the tenant's eval sets holds
never reach a train split, by sample id or by prompt (`cleaning.text.prompt_key`, the key the
split keeps on one side; equal content means an equal prompt). Choosing a version's samples is
refresh.py; the routes are routes.py.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from services.ingest.datasets.cleaning.report import StepReport
from services.ingest.datasets.cleaning.text import prompt_key
from services.ingest.http.errors import IngestError
from services.ingest.models import EvalSetItemRow, EvalSetRow, EvalSetVersionRow
from shared.chat import Sample
from shared.db import session_scope, utcnow

ID_PREFIX = "evs_"
DEFAULT_SIZE = 200
# As many as a dataset's eval split may hold: a refresh reads, scrubs and stores them at once.
MAX_SIZE = 1000
HOLDOUT_STEP = "eval_holdout"
HOLDOUT_REASON = "eval_set"


class EvalSetError(IngestError):
    """A refusal with its HTTP status; the message names the field or object at fault."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message, status=status)


@dataclass(frozen=True)
class HeldItem:
    """A sample a version holds: scrubbed, with the prompt key of the sample as captured
    (what a build compares its unscrubbed candidates with)."""

    sample: Sample
    prompt_key: str


def key_of(sample: Sample) -> str:
    return prompt_key(sample).hex()


def _json(value: Any) -> bytes:
    return orjson.dumps(value)


def create(
    session: Session,
    *,
    tenant: str,
    name: str,
    source: dict[str, Any],
    size: int,
    metadata: dict[str, str] | None,
) -> EvalSetRow:
    row = EvalSetRow(
        id=f"{ID_PREFIX}{uuid.uuid4().hex[:24]}",
        tenant=tenant,
        name=name,
        source=_json(source),
        size=size,
        meta=_json(metadata) if metadata is not None else None,
    )
    session.add(row)
    session.commit()
    session.refresh(row)
    return row


def get(session: Session, *, tenant: str, eval_set_id: str) -> EvalSetRow:
    row = session.get(EvalSetRow, eval_set_id)
    # Another tenant's eval set is as absent as a missing one.
    if row is None or row.tenant != tenant:
        raise EvalSetError(404, f"eval set {eval_set_id!r} not found")
    return row


def list_page(
    session: Session, *, tenant: str, limit: int, after: str | None
) -> tuple[list[EvalSetRow], bool]:
    """Newest first; `after` is the id of the last eval set of the previous page."""
    statement = select(EvalSetRow).where(EvalSetRow.tenant == tenant)
    if after is not None:
        try:
            anchor = get(session, tenant=tenant, eval_set_id=after)
        except EvalSetError:
            raise EvalSetError(400, f"after: eval set {after!r} not found") from None
        statement = statement.where(
            sa.or_(
                col(EvalSetRow.created_at) < anchor.created_at,
                sa.and_(
                    col(EvalSetRow.created_at) == anchor.created_at, col(EvalSetRow.id) < anchor.id
                ),
            )
        )
    statement = statement.order_by(col(EvalSetRow.created_at).desc(), col(EvalSetRow.id).desc())
    rows = list(session.exec(statement.limit(limit + 1)))
    return rows[:limit], len(rows) > limit


def versions(session: Session, eval_set: EvalSetRow) -> list[EvalSetVersionRow]:
    """Newest first."""
    statement = (
        select(EvalSetVersionRow)
        .where(EvalSetVersionRow.eval_set_id == eval_set.id)
        .order_by(col(EvalSetVersionRow.version).desc())
    )
    return list(session.exec(statement))


def version(session: Session, eval_set: EvalSetRow, number: str) -> EvalSetVersionRow:
    """`number` is a version number or `latest`; 404 naming it when there is none."""
    wanted = eval_set.latest_version if number == "latest" else int(number)
    row = session.get(EvalSetVersionRow, (eval_set.id, wanted)) if wanted else None
    if row is None:
        if number == "latest":
            raise EvalSetError(
                404,
                f"version: eval set {eval_set.id!r} has no version yet; "
                f"POST /v1/eval_sets/{eval_set.id}/refresh makes one",
            )
        raise EvalSetError(404, f"version: eval set {eval_set.id!r} has no version {number}")
    return row


def items(session: Session, version_row: EvalSetVersionRow) -> list[Sample]:
    """The version's samples, in their order (oldest first)."""
    statement = (
        select(EvalSetItemRow.body)
        .where(
            EvalSetItemRow.eval_set_id == version_row.eval_set_id,
            EvalSetItemRow.version == version_row.version,
        )
        .order_by(col(EvalSetItemRow.position))
    )
    return [Sample.from_json_bytes(body) for body in session.exec(statement)]


def save_version(
    engine: Engine,
    eval_set: EvalSetRow,
    chosen: Sequence[HeldItem],
    report: dict[str, Any],
) -> EvalSetVersionRow:
    """Write the next version. The eval set's `latest_version` moves with a conditional UPDATE,
    so two refreshes at once cannot both write version N: the second is a 409."""
    number = eval_set.latest_version + 1
    now = utcnow()
    with session_scope(engine) as session:
        moved = session.execute(
            sa.update(EvalSetRow)
            .where(
                col(EvalSetRow.id) == eval_set.id,
                col(EvalSetRow.latest_version) == eval_set.latest_version,
            )
            .values(latest_version=number, refreshed_at=now)
        )
        if moved.rowcount != 1:  # type: ignore[attr-defined]
            raise EvalSetError(
                409, f"eval set {eval_set.id!r} was refreshed meanwhile; retry the refresh"
            )
        row = EvalSetVersionRow(
            eval_set_id=eval_set.id,
            version=number,
            tenant=eval_set.tenant,
            item_count=len(chosen),
            report=_json(report),
            created_at=now,
        )
        session.add(row)
        session.add_all(
            EvalSetItemRow(
                eval_set_id=eval_set.id,
                version=number,
                position=position,
                tenant=eval_set.tenant,
                sample_id=item.sample.id,
                prompt_key=item.prompt_key,
                body=item.sample.to_json_bytes(),
            )
            for position, item in enumerate(chosen)
        )
    return row


def latest_sample_ids(session: Session, eval_set: EvalSetRow) -> set[str]:
    """The sample ids of the latest version (none before the first refresh)."""
    statement = select(EvalSetItemRow.sample_id).where(
        EvalSetItemRow.eval_set_id == eval_set.id,
        EvalSetItemRow.version == eval_set.latest_version,
    )
    return set(session.exec(statement))


# --- what every dataset build leaves out -------------------------------------------------------


def held(engine: Engine, *, tenant: str) -> tuple[set[str], set[str]]:
    """(sample ids, prompt keys) held by any version of any of the tenant's eval sets."""
    statement = sa.select(col(EvalSetItemRow.sample_id), col(EvalSetItemRow.prompt_key)).where(
        col(EvalSetItemRow.tenant) == tenant
    )
    with engine.connect() as connection:
        rows = connection.execute(statement).all()
    return {row[0] for row in rows}, {row[1] for row in rows}


def hold_out(
    engine: Engine, *, tenant: str, samples: Sequence[Sample], samples_in: int
) -> tuple[list[Sample], StepReport]:
    """A build's train candidates without the samples an eval set holds (reason `eval_set`).
    `samples_in` is what the step reports coming in (the candidates and any eval files')."""
    ids, keys = held(engine, tenant=tenant)
    kept = (
        [s for s in samples if s.id not in ids and key_of(s) not in keys] if ids else list(samples)
    )
    dropped = len(samples) - len(kept)
    removed = Counter({HOLDOUT_REASON: dropped}) if dropped else Counter[str]()
    return kept, StepReport.of(HOLDOUT_STEP, samples_in, removed)

"""The sample store: idempotent inserts, tenant-scoped reads with filters and keyset pagination."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal

import sqlalchemy as sa
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field
from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel import Session, col, select

from services.ingest.models import SampleRow, SampleTag
from shared.chat import Sample


class SampleQuery(BaseModel):
    """Filters of GET /v1/samples; unknown fields are refused by name."""

    model_config = ConfigDict(extra="forbid")

    since: AwareDatetime | None = None
    until: AwareDatetime | None = None
    source: Literal["gateway", "upload", "otlp"] | None = None
    model: str | None = None
    provider: str | None = None
    status: Literal["ok", "error"] | None = None
    tag: list[str] = Field(default_factory=list)
    limit: int = Field(default=100, ge=1, le=1000)
    cursor: str | None = None


# What a grown sample replaces; id, tenant and source stay as first stored.
_REPLACED = ("body", "message_count", "status", "finish_reason", "model", "provider", "created_at")


class BadCursor(ValueError):
    pass


def _insert(session: Session, table: type[Any]) -> Any:
    dialect = session.get_bind().dialect.name
    module = postgresql if dialect == "postgresql" else sqlite
    return module.insert(table)


def _row(sample: Sample) -> dict[str, Any]:
    response = sample.response
    return {
        "id": sample.id,
        "tenant": sample.tenant,
        "source": sample.source,
        "provider": response.provider if response else None,
        "model": (response.model or response.model_requested) if response else None,
        "status": response.status if response else "ok",
        "finish_reason": response.finish_reason if response else None,
        "created_at": sample.created_at,
        "message_count": len(sample.messages),
        "body": sample.to_json_bytes(),
    }


def insert_samples(session: Session, samples: Sequence[Sample]) -> int:
    """Store samples idempotently: an id seen before changes nothing, unless the sample now has
    more messages (a conversation that grew), which replaces it. Returns rows written."""
    if not samples:
        return 0
    latest: dict[str, Sample] = {}
    for sample in samples:
        kept = latest.get(sample.id)
        if kept is None or len(sample.messages) > len(kept.messages):
            latest[sample.id] = sample
    insert = _insert(session, SampleRow).values([_row(s) for s in latest.values()])
    grows = insert.excluded.message_count > SampleRow.message_count
    statement = insert.on_conflict_do_update(
        index_elements=["id"],
        set_={name: insert.excluded[name] for name in _REPLACED},
        where=grows,
    ).returning(SampleRow.id)
    written = {row[0] for row in session.execute(statement)}
    tags = [
        {"sample_id": s.id, "tag": tag, "tenant": s.tenant}
        for s in latest.values()
        for tag in set(s.tags)
    ]
    if tags:
        session.execute(_insert(session, SampleTag).values(tags).on_conflict_do_nothing())
    session.commit()
    return len(written)


def encode_cursor(row: SampleRow) -> str:
    return base64.urlsafe_b64encode(f"{row.created_at.isoformat()}|{row.id}".encode()).decode()


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    try:
        created, _, sample_id = base64.urlsafe_b64decode(cursor.encode()).decode().partition("|")
        return datetime.fromisoformat(created), sample_id
    except (ValueError, UnicodeDecodeError):
        raise BadCursor("cursor: not a cursor this API returned") from None


def list_samples(
    session: Session, *, tenant: str, query: SampleQuery
) -> tuple[list[Sample], str | None]:
    """Newest first; returns the page and the cursor of the next one (None at the end)."""
    statement = select(SampleRow).where(SampleRow.tenant == tenant)
    if query.since:
        statement = statement.where(SampleRow.created_at >= query.since)
    if query.until:
        statement = statement.where(SampleRow.created_at < query.until)
    for name in ("source", "model", "provider", "status"):
        value = getattr(query, name)
        if value is not None:
            statement = statement.where(getattr(SampleRow, name) == value)
    for tag in query.tag:
        tagged = select(SampleTag.sample_id).where(SampleTag.tenant == tenant, SampleTag.tag == tag)
        statement = statement.where(col(SampleRow.id).in_(tagged))
    if query.cursor:
        created, sample_id = decode_cursor(query.cursor)
        statement = statement.where(
            sa.or_(
                col(SampleRow.created_at) < created,
                sa.and_(col(SampleRow.created_at) == created, col(SampleRow.id) < sample_id),
            )
        )
    statement = statement.order_by(
        col(SampleRow.created_at).desc(), col(SampleRow.id).desc()
    ).limit(query.limit + 1)
    rows = list(session.exec(statement))
    page, more = rows[: query.limit], len(rows) > query.limit
    return [Sample.from_json_bytes(row.body) for row in page], encode_cursor(
        page[-1]
    ) if more else None


def get_sample(session: Session, *, tenant: str, sample_id: str) -> Sample | None:
    row = session.get(SampleRow, sample_id)
    # Another tenant's sample is as absent as a missing one.
    if row is None or row.tenant != tenant:
        return None
    return Sample.from_json_bytes(row.body)

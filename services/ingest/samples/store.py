"""The sample store: idempotent bulk inserts (also straight from sample.captured event bytes),
tenant-scoped reads with filters and keyset pagination."""

from __future__ import annotations

import base64
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, get_args

import orjson
import sqlalchemy as sa
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Dialect
from sqlmodel import Session, SQLModel, col, select

from services.ingest.http.errors import BadRequest
from services.ingest.models import SampleRow, SampleTag
from shared.chat import SCHEMA_VERSION, Sample, Source
from shared.db import utcnow
from shared.events import SampleCaptured
from shared.tenancy import is_tenant_id


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
_COLUMNS = ("id", "tenant", "source", "ingested_at", *_REPLACED)


class BadCursor(BadRequest, ValueError):
    """`cursor` is not one this API returned (400)."""


def dialect_insert(session: Session, table: sa.Table) -> Any:
    """An INSERT in the session's dialect (PostgreSQL or SQLite): both have ON CONFLICT."""
    dialect = session.get_bind().dialect.name
    module = postgresql if dialect == "postgresql" else sqlite
    return module.insert(table)


def _table(model: type[SQLModel]) -> sa.Table:
    table: sa.Table = model.__table__  # type: ignore[attr-defined]  # SQLModel sets it (table=True)
    return table


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
        "tags": sample.tags,
    }


def insert_samples(session: Session, samples: Sequence[Sample]) -> int:
    """Store samples idempotently: an id seen before changes nothing, unless the sample now has
    more messages (a conversation that grew), which replaces it. Returns rows written."""
    return insert_rows(session, [_row(sample) for sample in samples])


def insert_rows(session: Session, rows: Sequence[dict[str, Any]]) -> int:
    """`insert_samples` for rows already made (`_row`, `row_from_event`): one executemany upsert
    of the lot, committed once. Returns rows written."""
    if not rows:
        return 0
    latest: dict[str, dict[str, Any]] = {}
    for row in rows:
        kept = latest.get(row["id"])
        if kept is None or row["message_count"] > kept["message_count"]:
            latest[row["id"]] = row
    connection = session.connection()
    upsert = _upsert_for(connection.dialect)
    now = utcnow()
    # The rows go to the driver's executemany as they are, through a statement compiled once
    # per dialect: SQLAlchemy's own executemany spent more CPU per row (parameter dicts, a
    # Python default and two type processors each, RETURNING batches) than the database did.
    params = [upsert.params(row, now) for row in latest.values()]
    written = connection.exec_driver_sql(upsert.sql, params).rowcount
    tags = [
        {"sample_id": row["id"], "tag": tag, "tenant": row["tenant"]}
        for row in latest.values()
        for tag in set(row["tags"])
    ]
    if tags:
        session.execute(dialect_insert(session, _table(SampleTag)).on_conflict_do_nothing(), tags)
    session.commit()
    return written


@dataclass(frozen=True, slots=True)
class _Upsert:
    """The sample upsert compiled for one dialect, with the order and bind processors of its
    parameters: rows are turned into driver parameters without SQLAlchemy per row."""

    sql: str
    columns: tuple[str, ...]
    positional: bool
    processors: tuple[Callable[[Any], Any] | None, ...]

    def params(self, row: dict[str, Any], now: datetime) -> tuple[Any, ...] | dict[str, Any]:
        values = [row[name] if name != "ingested_at" else now for name in self.columns]
        for i, process in enumerate(self.processors):
            if process is not None:
                values[i] = process(values[i])
        return tuple(values) if self.positional else dict(zip(self.columns, values, strict=True))


_UPSERTS: dict[tuple[str, str, str], _Upsert] = {}


def _upsert_for(dialect: Dialect) -> _Upsert:
    key = (dialect.name, dialect.driver, dialect.paramstyle)
    upsert = _UPSERTS.get(key)
    if upsert is None:
        upsert = _UPSERTS[key] = _compile_upsert(dialect)
    return upsert


def _compile_upsert(dialect: Dialect) -> _Upsert:
    table = _table(SampleRow)
    module = postgresql if dialect.name == "postgresql" else sqlite
    insert = module.insert(table).values({name: sa.bindparam(name) for name in _COLUMNS})
    # Without RETURNING: the driver's rowcount (the sum over the executemany, 0 for a row whose
    # WHERE kept the stored one) already says how many were written.
    statement = insert.on_conflict_do_update(
        index_elements=["id"],
        set_={name: insert.excluded[name] for name in _REPLACED},
        where=insert.excluded.message_count > table.c.message_count,
    )
    compiled = statement.compile(dialect=dialect)
    order = tuple(compiled.positiontup or ()) if compiled.positional else _COLUMNS
    if set(order) != set(_COLUMNS):
        raise RuntimeError(f"the sample upsert binds {order}, not {_COLUMNS}")
    # dialect_impl: a TypeDecorator's own bind_processor wraps the generic type's, which on SQLite
    # leaves datetimes to the driver (its ISO format, not the one SQLAlchemy stores and compares).
    processors = tuple(
        table.c[name].type.dialect_impl(dialect).bind_processor(dialect) for name in order
    )
    return _Upsert(str(compiled), order, compiled.positional, processors)


# --- rows straight from sample.captured events --------------------------------------------------


class BadSampleEvent(ValueError):
    """A sample.captured message the store cannot take; the text names the field."""


_SOURCES = frozenset(get_args(Source))
# Values of these keys are free-form JSON (a dict field), where a null is data, not "unset".
_FREE_FORM = frozenset({"metadata", "parameters", "response_format", "tool_choice"})


# A row still to be read from object storage (an event that carries its sample by reference):
# this key holds the s3:// URI; `resolve_row` makes it a row.
SAMPLE_REF = "sample_ref"


def row_from_event(data: bytes, subject: str) -> dict[str, Any]:
    """A `SampleCaptured` message body -> the row `insert_rows` stores, without re-validating
    the sample: every producer built it as a validated `Sample` (the edges validate), so this
    checks what the store relies on (tenant, subject, versions, id, source, time, messages) and
    compacts the JSON as `Sample.to_json_bytes` does. An event that names its sample by
    reference gives `{SAMPLE_REF: uri, "tenant": ...}` for `resolve_row`. Raises BadSampleEvent
    naming the field."""
    event = _object(_loads(data), "event")
    tenant = event.get("tenant")
    if not isinstance(tenant, str) or not is_tenant_id(tenant):
        raise BadSampleEvent(f"tenant: {str(tenant)[:70]!r} is not a tenant id")
    if subject != SampleCaptured.subject_for(tenant):
        raise BadSampleEvent(f"subject {subject!r} is not the event tenant's ({tenant})")
    if event.get("schema_version") != SampleCaptured.event_version:
        raise BadSampleEvent(f"schema_version: {event.get('schema_version')!r} is not supported")
    if event.get("sample") is None and event.get(SAMPLE_REF) is not None:
        return {SAMPLE_REF: _sample_ref(event[SAMPLE_REF], tenant), "tenant": tenant}
    sample = _object(event.get("sample"), "sample")
    return row_from_sample(sample, tenant, nulls=b"null" in data)


def _sample_ref(value: Any, tenant: str) -> str:
    """The reference, if it names an object under the tenant's own samples prefix."""
    if not isinstance(value, str) or f"/tenants/{tenant}/samples/" not in value:
        raise BadSampleEvent(f"sample_ref: {str(value)[:120]!r} is not one of {tenant}'s samples")
    return value


def resolve_row(row: dict[str, Any], read: Callable[[str], bytes]) -> dict[str, Any]:
    """The row itself, or for a by-reference one the row made from the object `read` returns
    (blocking). Raises BadSampleEvent when the object is not a sample of the row's tenant."""
    ref = row.get(SAMPLE_REF)
    if ref is None:
        return row
    data = read(ref)
    return row_from_sample(_object(_loads(data), "sample"), row["tenant"], nulls=b"null" in data)


def row_from_sample(sample: dict[str, Any], tenant: str, *, nulls: bool) -> dict[str, Any]:
    """A sample's JSON -> its row (see `row_from_event`); `nulls`: whether it may hold any."""
    if sample.get("tenant") != tenant:
        raise BadSampleEvent(f"sample.tenant {sample.get('tenant')!r} differs from {tenant!r}")
    if sample.get("schema_version") != SCHEMA_VERSION:
        raise BadSampleEvent(f"sample.schema_version: {sample.get('schema_version')!r}")
    messages = sample.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadSampleEvent("sample.messages: must be a non-empty array")
    response = sample.get("response")
    response = _object(response, "sample.response") if response is not None else {}
    created_at = _time(sample.get("created_at"))
    return {
        "id": _text(sample, "id", "sample.id", required=True),
        "tenant": tenant,
        "source": _source(sample.get("source")),
        "provider": _text(response, "provider", "sample.response.provider"),
        "model": _text(response, "model", "sample.response.model")
        or _text(response, "model_requested", "sample.response.model_requested"),
        "status": _text(response, "status", "sample.response.status") or "ok",
        "finish_reason": _text(response, "finish_reason", "sample.response.finish_reason"),
        "created_at": created_at,
        "message_count": len(messages),
        "body": orjson.dumps(_compact(sample, nulls=nulls) | {"created_at": created_at}),
        "tags": _tags(sample.get("tags")),
    }


def _loads(data: bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise BadSampleEvent(f"event: not JSON ({exc})") from None


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadSampleEvent(f"{where}: must be an object")
    return value


def _text(obj: dict[str, Any], key: str, where: str, *, required: bool = False) -> str | None:
    value = obj.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or (required and not value):
        raise BadSampleEvent(f"{where}: must be a {'non-empty ' if required else ''}string")
    return value


def _source(value: Any) -> str:
    if value not in _SOURCES:
        raise BadSampleEvent(f"sample.source: {str(value)[:40]!r} is not one of {sorted(_SOURCES)}")
    return str(value)


def _time(value: Any) -> datetime:
    try:
        moment = datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None:
        raise BadSampleEvent("sample.created_at: must be an ISO 8601 time with a zone")
    return moment


def _tags(value: Any) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(tag, str) for tag in value):
        raise BadSampleEvent("sample.tags: must be an array of strings")
    return value


def _compact(sample: dict[str, Any], *, nulls: bool) -> dict[str, Any]:
    """The sample as `Sample.to_json_bytes` writes it: no nulls (except inside free-form
    fields), and no empty per-message defaults. `nulls=False` says the event's bytes hold no
    `null` at all (the capture pipeline encodes without None fields): nothing to strip, and the
    walk, most of the persister's row-building time, is skipped."""
    compact: dict[str, Any] = _no_nulls(sample) if nulls else sample
    for message in compact["messages"]:
        if isinstance(message, dict):
            for key in ("tool_calls", "reasoning"):
                if message.get(key) == []:
                    del message[key]
            if message.get("is_error") is False:
                del message["is_error"]
    return compact


def _no_nulls(value: Any) -> Any:
    # Only containers are walked into: the call per scalar leaf (most of a sample) was most of
    # the persister's row-building time. orjson.loads gives exact dicts and lists, hence `type`.
    kind = type(value)
    if kind is dict:
        return {
            k: _no_nulls(v) if (type(v) is dict or type(v) is list) and k not in _FREE_FORM else v
            for k, v in value.items()
            if v is not None
        }
    if kind is list:
        return [
            _no_nulls(item) if type(item) is dict or type(item) is list else item for item in value
        ]
    return value


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

"""Which samples a dataset is built from: a filter over the sample store, or uploaded files.

Rows are read in keyset pages of (created_at, id), oldest first, with only the columns needed,
so a 100k-sample selection never sits in one result set and its order is the same every time
(the split and the version hash depend on it). What SQL can filter (time, source, provider,
status, tags, purposes, the newest feedback's label and score) is filtered there; models and
metadata are checked on the parsed sample with the filter's own `matches`, and file membership
on the stored bytes, since none has a column.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from services.ingest.datasets.spec import SampleFilter
from services.ingest.gateway.purpose import PLATFORM_PREFIXES
from services.ingest.http.errors import Unprocessable
from services.ingest.models import SampleRow, SampleTag, UploadedFile
from services.ingest.samples.feedback import store as feedback
from shared.chat import Sample
from shared.db import UTCDateTime

PAGE_SIZE = 2_000


class SelectionError(Unprocessable, ValueError):
    """The selection cannot be used; `field` names the part of the request at fault."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class UnknownFile(SelectionError):
    status = 404


class FileNotReady(SelectionError):
    status = 409


@dataclass(frozen=True)
class FileSelection:
    """An uploaded file and how many samples its import made (what the build waits for)."""

    file_id: str
    samples: int

    @property
    def ref_marker(self) -> bytes:
        # Upload samples carry source_ref "<file id>:<line>"; Sample.to_json_bytes is compact
        # orjson, so this exact byte string is in every such sample's stored body.
        return b'"source_ref":"' + self.file_id.encode() + b":"


# --- filter -----------------------------------------------------------------------------------


def _filter_conditions(tenant: str, selection: SampleFilter | None) -> list[Any]:
    """What SQL can decide of the filter. Not `models`: it matches the requested model as well
    as the answering one, and only the latter has a column. Not `metadata`: no column."""
    conditions: list[Any] = [SampleRow.tenant == tenant]
    if selection is None:
        return conditions
    if selection.since is not None:
        conditions.append(col(SampleRow.created_at) >= selection.since)
    if selection.until is not None:
        conditions.append(col(SampleRow.created_at) < selection.until)
    if selection.sources:
        conditions.append(col(SampleRow.source).in_(list(selection.sources)))
    if selection.providers:
        conditions.append(col(SampleRow.provider).in_(list(selection.providers)))
    if selection.status is not None:
        conditions.append(SampleRow.status == selection.status)
    for tag in selection.tags:  # every tag must be on the sample
        # Correlated EXISTS, a primary-key lookup per row: an IN (subquery) would rebuild the
        # list of every tagged id for each page (100k ids: 0.4 s a page on SQLite).
        tagged = sa.exists().where(
            col(SampleTag.sample_id) == col(SampleRow.id), col(SampleTag.tag) == tag
        )
        conditions.append(tagged)
    # The platform's own calls (purposed, eval runs') only when asked for (include_purposes,
    # or the tag named).
    purposed = sa.exists().where(
        col(SampleTag.sample_id) == col(SampleRow.id),
        sa.or_(
            *(
                col(SampleTag.tag).startswith(prefix, autoescape=True)
                for prefix in PLATFORM_PREFIXES
            )
        ),
        col(SampleTag.tag).not_in(sorted(selection.purpose_tags_kept())),
    )
    conditions.append(~purposed)
    # Feedback (POST /v1/feedback): the newest label / score of each sample, a correlated
    # subquery seeking (tenant, sample_id), evaluated only when the filter asks for it.
    if selection.feedback_label:
        label = feedback.newest_label(tenant=tenant, sample_id=col(SampleRow.id))
        conditions.append(label.in_(list(selection.feedback_label)))
    if selection.min_feedback_score is not None:
        score = feedback.newest_score(tenant=tenant, sample_id=col(SampleRow.id))
        conditions.append(score >= selection.min_feedback_score)
    return conditions


def count_filtered(session: Session, *, tenant: str, selection: SampleFilter | None) -> int:
    """An upper bound of what the filter selects: exact unless it names models or metadata,
    which only the build can check."""
    statement = select(sa.func.count()).select_from(SampleRow)
    statement = statement.where(*_filter_conditions(tenant, selection))
    return int(session.exec(statement).one())


def _pages(
    engine: Engine, conditions: list[Any], page_size: int, *, newest_first: bool = False
) -> Iterator[list[Any]]:
    """(created_at, id, body) rows matching `conditions`, oldest first (or newest first), one
    page at a time."""
    after: tuple[datetime, str] | None = None
    while True:
        statement = sa.select(
            col(SampleRow.created_at), col(SampleRow.id), col(SampleRow.body)
        ).where(*conditions)
        if after is not None:
            # A row-value comparison: both SQLite and PostgreSQL seek the (tenant, created_at,
            # id) index to it, where an OR of the two cases may not.
            created, sample_id = after
            key = sa.tuple_(col(SampleRow.created_at), col(SampleRow.id))
            seen = sa.tuple_(sa.literal(created, UTCDateTime()), sa.literal(sample_id, sa.String()))
            statement = statement.where(key < seen if newest_first else key > seen)
        order: list[Any] = [col(SampleRow.created_at), col(SampleRow.id)]
        if newest_first:
            order = [column.desc() for column in order]
        statement = statement.order_by(*order).limit(page_size)
        with engine.connect() as connection:
            rows = connection.execute(statement).all()
        if not rows:
            return
        yield list(rows)
        if len(rows) < page_size:
            return
        after = (rows[-1][0], rows[-1][1])


def iter_filtered(
    engine: Engine,
    *,
    tenant: str,
    selection: SampleFilter | None,
    page_size: int = PAGE_SIZE,
    newest_first: bool = False,
) -> Iterator[Sample]:
    """The filter's samples, oldest first (a dataset), or newest first (an eval set's refresh,
    which stops once it has enough)."""
    conditions = _filter_conditions(tenant, selection)
    # What SQL could not decide; the feedback criteria it did decide are left out of the check.
    check = (
        selection.model_copy(update={"feedback_label": [], "min_feedback_score": None})
        if selection is not None and (selection.models or selection.metadata)
        else None
    )
    for rows in _pages(engine, conditions, page_size, newest_first=newest_first):
        for row in rows:
            sample = Sample.from_json_bytes(row[2])
            if check is None or check.matches(sample):
                yield sample


# --- files ------------------------------------------------------------------------------------


def check_files(
    session: Session, *, tenant: str, file_ids: Sequence[str], field_name: str = "file_ids"
) -> list[FileSelection]:
    """The files a dataset is built from: each must be this tenant's and processed. Errors
    name `<field_name>[<index>]` (file_ids or eval_file_ids)."""
    found: list[FileSelection] = []
    for index, file_id in enumerate(file_ids):
        row = session.get(UploadedFile, file_id)
        field = f"{field_name}[{index}]"
        if row is None or row.tenant != tenant:
            raise UnknownFile(field, f"file {file_id!r} not found")
        if row.status in ("uploaded", "processing"):
            raise FileNotReady(
                field, f"file {file_id!r} is still being processed; retry once it is processed"
            )
        if row.status != "processed":
            raise SelectionError(field, f"file {file_id!r} could not be imported: {row.status}")
        report: dict[str, Any] = orjson.loads(row.report) if row.report else {}
        found.append(FileSelection(file_id, int(report.get("samples", 0))))
    return found


def _upload_rows(engine: Engine, tenant: str, page_size: int) -> Iterator[list[Any]]:
    conditions = [SampleRow.tenant == tenant, SampleRow.source == "upload"]
    return _pages(engine, conditions, page_size)


def iter_files(
    engine: Engine,
    *,
    tenant: str,
    files: Sequence[FileSelection],
    page_size: int = PAGE_SIZE,
) -> Iterator[Sample]:
    """Samples imported from `files`, in the store's order."""
    markers = [f.ref_marker for f in files]
    for rows in _upload_rows(engine, tenant, page_size):
        for row in rows:
            body: bytes = row[2]
            if any(marker in body for marker in markers):
                sample = Sample.from_json_bytes(body)
                ref = sample.source_ref or ""
                if any(ref.startswith(f"{f.file_id}:") for f in files):
                    yield sample


def count_files(engine: Engine, *, tenant: str, files: Sequence[FileSelection]) -> int:
    """Samples of `files` already in the store (their import publishes them asynchronously)."""
    markers = [f.ref_marker for f in files]
    return sum(
        1
        for rows in _upload_rows(engine, tenant, PAGE_SIZE)
        for row in rows
        if any(marker in row[2] for marker in markers)
    )

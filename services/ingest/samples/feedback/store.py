"""Feedback rows: stored, listed, and each sample's newest label and score for selection.

Every feedback is kept (a history, not a vote count). For selection a sample's label is the
label of its newest feedback that has one, and its score likewise: a later score without a
label does not take back an earlier label. Newest is by `(created_at, id)`. Every query is
scoped to one tenant, so a sample id another tenant gave feedback on is never affected.
"""

from __future__ import annotations

import uuid
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from services.ingest.models import FeedbackRow

ID_PREFIX = "fb_"
# A label is a tag-like token: `good`, `bad`, `thumbs_up`, `needs-review`, `rubric:tone`.
LABEL_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$"
LABEL_MAX_LENGTH = 64
LABEL_RULE = f"1-{LABEL_MAX_LENGTH} letters, digits, _ . : or -, starting with a letter or digit"
# The `score_key` under which rejection sampling reads a sample's newest feedback score first
# (cleaning.scoring): feedback's field is named `score`.
SCORE_KEY = "score"


def new_feedback_id() -> str:
    return ID_PREFIX + uuid.uuid4().hex


def record(
    session: Session,
    *,
    tenant: str,
    sample_id: str,
    score: float | None,
    label: str | None,
    comment: str | None,
) -> FeedbackRow:
    """Store one feedback; the sample need not be stored yet (the shipper may lag the answer)."""
    row = FeedbackRow(
        id=new_feedback_id(),
        tenant=tenant,
        sample_id=sample_id,
        score=score,
        label=label,
        comment=comment,
    )
    session.add(row)
    session.commit()
    session.refresh(row)
    return row


def for_sample(session: Session, *, tenant: str, sample_id: str, limit: int) -> list[FeedbackRow]:
    """The tenant's feedback on one sample, newest first, at most `limit`."""
    statement = (
        select(FeedbackRow)
        .where(FeedbackRow.tenant == tenant, FeedbackRow.sample_id == sample_id)
        .order_by(col(FeedbackRow.created_at).desc(), col(FeedbackRow.id).desc())
        .limit(limit)
    )
    return list(session.exec(statement).all())


def _newest(column: Any, *, tenant: str, sample_id: Any) -> Any:
    """A correlated scalar subquery: `column` of the newest feedback on `sample_id` (a column
    of the enclosing query) that has one; NULL without any. An index seek per sample on
    (tenant, sample_id) and a sort of that sample's few rows."""
    return (
        sa.select(column)
        .where(
            col(FeedbackRow.tenant) == tenant,
            col(FeedbackRow.sample_id) == sample_id,
            column.is_not(None),
        )
        .order_by(col(FeedbackRow.created_at).desc(), col(FeedbackRow.id).desc())
        .limit(1)
        .scalar_subquery()
    )


def newest_label(*, tenant: str, sample_id: Any) -> Any:
    return _newest(col(FeedbackRow.label), tenant=tenant, sample_id=sample_id)


def newest_score(*, tenant: str, sample_id: Any) -> Any:
    return _newest(col(FeedbackRow.score), tenant=tenant, sample_id=sample_id)


def newest_scores(engine: Engine, *, tenant: str) -> dict[str, float]:
    """Each sample's newest feedback score, for a whole build in one query (rejection
    sampling looks up every sample; a query per sample would be 100k round trips)."""
    statement = (
        sa.select(col(FeedbackRow.sample_id), col(FeedbackRow.score))
        .where(col(FeedbackRow.tenant) == tenant, col(FeedbackRow.score).is_not(None))
        .order_by(col(FeedbackRow.created_at), col(FeedbackRow.id))
    )
    scores: dict[str, float] = {}
    with engine.connect() as connection:
        # Oldest first: a later row overwrites an earlier one, so the newest is what stays.
        for sample_id, score in connection.execute(statement):
            if score is not None:  # never, by the query; for the type
                scores[sample_id] = score
    return scores

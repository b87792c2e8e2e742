"""HTTP routes of feedback: `POST /v1/feedback` stores one, `GET /v1/feedback?sample_id=` lists
a sample's. Both are the caller's tenant's only. A comment is the user's text: it is stored and
returned, never logged."""

from __future__ import annotations

from typing import Annotated, Literal, Self

from fastapi import APIRouter, Query, status
from pydantic import BaseModel, ConfigDict, Field, model_validator

from services.ingest.http.deps import EngineDep
from services.ingest.models import FeedbackRow
from services.ingest.samples.feedback import store
from shared import auth
from shared.db import session_scope

router = APIRouter(tags=["feedback"])

# Any sample id (the gateway's are uuids; an upload may bring its own) up to the store's 64
# characters, without control characters.
SAMPLE_ID_PATTERN = r"^[^\x00-\x1f\x7f]+$"
# Free text; line breaks and tabs are fine, other control characters (NUL) are not.
COMMENT_PATTERN = r"^[^\x00-\x08\x0b\x0c\x0e-\x1f\x7f]*$"
SampleId = Annotated[str, Field(min_length=1, max_length=64, pattern=SAMPLE_ID_PATTERN)]


class FeedbackIn(BaseModel):
    """A verdict on one sample. Strict: a score is a JSON number (not a string or a boolean)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    sample_id: SampleId = Field(description="the `x-tuneloop-sample-id` of a captured call")
    score: float | None = Field(
        default=None,
        allow_inf_nan=False,
        description="any finite number, on the scale you choose (0-1, 1-5, ...); datasets "
        "select by it with source.min_feedback_score, or cleaning.min_score",
    )
    label: str | None = Field(
        default=None,
        min_length=1,
        max_length=store.LABEL_MAX_LENGTH,
        pattern=store.LABEL_PATTERN,
        description="a tag-like token (letters, digits, _ . : -), e.g. good or bad; datasets "
        "select by it with source.feedback_label",
    )
    comment: str | None = Field(default=None, max_length=2000, pattern=COMMENT_PATTERN)

    @model_validator(mode="after")
    def _says_something(self) -> Self:
        if self.score is None and self.label is None:
            raise ValueError("score / label: give a score, a label or both")
        return self


class Feedback(BaseModel):
    id: str
    object: Literal["feedback"] = "feedback"
    sample_id: str
    score: float | None
    label: str | None
    comment: str | None
    created_at: int = Field(description="unix seconds")

    @classmethod
    def of(cls, row: FeedbackRow) -> Feedback:
        return cls(
            id=row.id,
            sample_id=row.sample_id,
            score=row.score,
            label=row.label,
            comment=row.comment,
            created_at=int(row.created_at.timestamp()),
        )


class FeedbackList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Feedback]
    has_more: bool


@router.post(
    "/v1/feedback",
    status_code=status.HTTP_201_CREATED,
    response_model=Feedback,
    summary="Give feedback on a sample (a score and/or a label, and a comment)",
)
def create_feedback(body: FeedbackIn, principal: auth.WriterDep, engine: EngineDep) -> Feedback:
    """Accepted for any sample id, stored or not yet (the sample of a call that was just
    answered is stored a moment later); the newest label and score count for selection."""
    with session_scope(engine) as session:
        row = store.record(
            session,
            tenant=principal.tenant_id,
            sample_id=body.sample_id,
            score=body.score,
            label=body.label,
            comment=body.comment,
        )
        return Feedback.of(row)


@router.get(
    "/v1/feedback",
    response_model=FeedbackList,
    summary="The feedback given on a sample, newest first",
)
def list_feedback(
    sample_id: Annotated[str, Query(min_length=1, max_length=64, pattern=SAMPLE_ID_PATTERN)],
    principal: auth.PrincipalDep,
    engine: EngineDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> FeedbackList:
    with session_scope(engine) as session:
        rows = store.for_sample(
            session, tenant=principal.tenant_id, sample_id=sample_id, limit=limit + 1
        )
        return FeedbackList(
            data=[Feedback.of(row) for row in rows[:limit]], has_more=len(rows) > limit
        )

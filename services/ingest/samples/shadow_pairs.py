"""Shadow pairs for the evaluator's pairwise score: the two samples of one mirrored call (the
primary's answer and the shadow's, both tagged `shadow_pair:<id>` by the gateway), read back
together after a cursor.

A pair is listed once both of its samples are stored, ordered by when the later one was stored
(`ingested_at`) and then by pair id: that order only grows as samples arrive, so a cursor of
(stored time, pair id) never skips a pair, provided a pair is listed only once its later sample
is `SETTLE_S` old (two writers' transactions may commit a moment out of order). A pair whose
shadow failed (an error answer, or unreachable) is listed with the failure, so it is counted,
not judged. A pair whose other sample never arrives is never listed.
"""

from __future__ import annotations

import base64
from datetime import datetime, timedelta
from typing import Literal

import sqlalchemy as sa
from pydantic import BaseModel, Field
from sqlmodel import Session, col, select

from services.ingest.gateway.calls import SHADOW_PURPOSE
from services.ingest.gateway.reading import SHADOW_PAIR_PREFIX
from services.ingest.gateway.routing import VERSION_TAG_PREFIX
from services.ingest.http.errors import Unprocessable
from services.ingest.models import SampleRow, SampleTag
from shared.chat import Message, Sample
from shared.db import utcnow

SETTLE_S = 2.0
# Tags of one prefix as an index range: `;` is the character after `:`.
_PAIR_LOW, _PAIR_HIGH = SHADOW_PAIR_PREFIX, SHADOW_PAIR_PREFIX[:-1] + ";"


class BadAfter(Unprocessable, ValueError):
    """`after` is not a cursor this API returned (422)."""


class Turn(BaseModel):
    role: str
    content: str


class PairSide(BaseModel):
    sample_id: str
    model_version: str | None = Field(description="the version that answered (its tag)")
    model: str | None = Field(description="the model name the engine answered as")
    status: Literal["ok", "error"]
    answer: str = Field(description="the answer's text, tool calls written out; '' on a failure")
    error: str | None = None


class ShadowPair(BaseModel):
    pair_id: str
    served_name: str | None = Field(description="the name the caller asked for")
    conversation: list[Turn] = Field(description="the request's messages")
    primary: PairSide
    shadow: PairSide
    captured_at: datetime = Field(description="when the call was made")
    stored_at: datetime = Field(description="when its later sample was stored")
    cursor: str


class ShadowPairPage(BaseModel):
    object: Literal["list"] = "list"
    data: list[ShadowPair]
    # The last pair's cursor (the one given when there is none): what the next `after` is.
    next_cursor: str | None
    has_more: bool


def encode_cursor(stored_at: datetime, pair_id: str) -> str:
    return base64.urlsafe_b64encode(f"{stored_at.isoformat()}|{pair_id}".encode()).decode()


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    try:
        stored, _, pair_id = base64.urlsafe_b64decode(cursor.encode()).decode().partition("|")
        return datetime.fromisoformat(stored), pair_id
    except (ValueError, UnicodeDecodeError):
        raise BadAfter("after: not a cursor this API returned") from None


def list_pairs(session: Session, *, tenant: str, after: str | None, limit: int) -> ShadowPairPage:
    """The tenant's complete pairs stored after `after`, oldest first, at most `limit`."""
    stored = sa.func.max(SampleRow.ingested_at).label("stored")
    tag = col(SampleTag.tag)
    query = (
        select(tag, stored)
        .join(SampleRow, col(SampleRow.id) == col(SampleTag.sample_id))
        .where(SampleTag.tenant == tenant, tag >= _PAIR_LOW, tag < _PAIR_HIGH)
        .group_by(tag)
        .having(sa.func.count() >= 2)
        .having(stored <= utcnow() - timedelta(seconds=SETTLE_S))
    )
    if after:
        at, pair_id = decode_cursor(after)
        query = query.having(sa.or_(stored > at, sa.and_(stored == at, tag > pair_id)))
    found = list(session.exec(query.order_by(stored, tag).limit(limit + 1)))
    page = found[:limit]
    pairs = [p for p in (_pair(session, tenant, t, at) for t, at in page) if p is not None]
    last = encode_cursor(page[-1][1], page[-1][0]) if page else after
    return ShadowPairPage(data=pairs, next_cursor=last, has_more=len(found) > limit)


def _pair(session: Session, tenant: str, tag: str, stored_at: datetime) -> ShadowPair | None:
    rows = session.exec(
        select(SampleRow)
        .join(SampleTag, col(SampleTag.sample_id) == col(SampleRow.id))
        .where(SampleTag.tenant == tenant, SampleTag.tag == tag)
    ).all()
    samples = [Sample.from_json_bytes(row.body) for row in rows]
    shadows = [s for s in samples if SHADOW_PURPOSE in s.tags]
    primaries = [s for s in samples if SHADOW_PURPOSE not in s.tags]
    if len(shadows) != 1 or len(primaries) != 1:
        return None  # not a pair the gateway made (n > 1 answers one sample per choice)
    primary, shadow = primaries[0], shadows[0]
    conversation = list(primary.messages)
    if conversation and conversation[-1].role == "assistant" and _ok(primary):
        conversation = conversation[:-1]
    return ShadowPair(
        pair_id=tag.removeprefix(SHADOW_PAIR_PREFIX),
        served_name=primary.response.model_requested if primary.response else None,
        conversation=[Turn(role=m.role, content=_text(m)) for m in conversation],
        primary=_side(primary),
        shadow=_side(shadow),
        captured_at=primary.created_at,
        stored_at=stored_at,
        cursor=encode_cursor(stored_at, tag),
    )


def _ok(sample: Sample) -> bool:
    return sample.response is None or sample.response.status == "ok"


def _text(message: Message) -> str:
    calls = [f"[tool call] {call.name}({call.arguments})" for call in message.tool_calls]
    return "\n".join([message.text(), *calls]).strip()


def _side(sample: Sample) -> PairSide:
    version = next((t for t in sample.tags if t.startswith(VERSION_TAG_PREFIX)), None)
    response = sample.response
    failed = response is not None and response.status == "error"
    last = sample.messages[-1]
    error = None
    if failed and response is not None and response.error is not None:
        error = response.error.message or f"status {response.error.status_code}"
    return PairSide(
        sample_id=sample.id,
        model_version=version.removeprefix(VERSION_TAG_PREFIX) if version else None,
        model=response.model if response else None,
        status="error" if failed else "ok",
        answer="" if failed or last.role != "assistant" else _text(last),
        error=error,
    )

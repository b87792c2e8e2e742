"""The outbox: a delivery row per alert and rule, written before anything is sent, so an alert
matched is an alert delivered (or recorded as given up) whatever restarts in between.

A delivery is `pending` with the time of its next try, then `delivered` or `failed`. A sender
claims a due delivery by moving its next try past the request's timeout (a conditional update
only one scheduler replica wins); if it dies mid-send, the claim runs out and the delivery is
tried again: receivers deduplicate on its id (the webhook-id header).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel import Session, col, select

from services.scheduler.models import (
    NotificationAttemptRow,
    NotificationDeliveryRow,
    NotificationRuleRow,
)
from services.scheduler.notifications.rules import RuleError
from services.scheduler.notifications.schemas import Delivery, DeliveryAttempt

Outcome = Literal["delivered", "retry", "failed"]
MESSAGE_ID_PREFIX = "msg_"


def new_message_id() -> str:
    return f"{MESSAGE_ID_PREFIX}{uuid.uuid4().hex}"


def enqueue(
    session: Session,
    *,
    rule: NotificationRuleRow,
    event: str,
    key: str,
    message_id: str,
    body: bytes,
    now: datetime,
) -> bool:
    """Add the delivery unless this rule already has one for `key`; True when added."""
    table = _table(NotificationDeliveryRow)
    module: Any = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
    values = NotificationDeliveryRow(
        id=message_id,
        rule_id=rule.id,
        tenant=rule.tenant,
        event=event,
        key=key[:200],
        url=rule.url,
        body=body,
        status="pending",
        next_attempt_at=now,
        created_at=now,
    ).model_dump()
    statement = module.insert(table).values(values).on_conflict_do_nothing()
    return bool(session.execute(statement).rowcount)  # type: ignore[attr-defined]


def due(session: Session, *, now: datetime, limit: int) -> list[NotificationDeliveryRow]:
    query = (
        select(NotificationDeliveryRow)
        .where(NotificationDeliveryRow.status == "pending")
        .where(col(NotificationDeliveryRow.next_attempt_at) <= now)
        .order_by(col(NotificationDeliveryRow.next_attempt_at))
        .limit(limit)
    )
    return list(session.exec(query).all())


def claim(session: Session, delivery: NotificationDeliveryRow, *, until: datetime) -> bool:
    """Take the delivery for one try (its next try moved to `until`); False when another
    sender took it first."""
    table = _table(NotificationDeliveryRow)
    statement = (
        sa.update(table)
        .where(table.c.id == delivery.id)
        .where(table.c.status == "pending")
        .where(table.c.next_attempt_at == delivery.next_attempt_at)
        .values(next_attempt_at=until)
    )
    claimed = bool(session.execute(statement).rowcount)  # type: ignore[attr-defined]
    session.commit()
    return claimed


@dataclass(frozen=True)
class Tried:
    """One attempt's result and what follows it."""

    started_at: datetime
    duration_ms: float
    status_code: int | None
    error: str | None
    outcome: Outcome
    next_attempt_at: datetime | None  # a retry's time


def record(session: Session, delivery_id: str, tried: Tried) -> int:
    """Keep the attempt and move the delivery on; the attempt's number."""
    row = session.get(NotificationDeliveryRow, delivery_id)
    if row is None:  # its rule was deleted while the request was out
        return 0
    row.attempts += 1
    row.last_status_code, row.last_error = tried.status_code, tried.error
    if tried.outcome == "delivered":
        row.status, row.delivered_at, row.next_attempt_at = "delivered", tried.started_at, None
    elif tried.outcome == "failed":
        row.status, row.next_attempt_at = "failed", None
    else:
        row.next_attempt_at = tried.next_attempt_at
    session.add(row)
    session.add(
        NotificationAttemptRow(
            id=f"{delivery_id}-{row.attempts}",
            delivery_id=delivery_id,
            number=row.attempts,
            started_at=tried.started_at,
            duration_ms=tried.duration_ms,
            status_code=tried.status_code,
            error=tried.error,
            outcome=tried.outcome,
        )
    )
    session.commit()
    return row.attempts


def page(
    session: Session, *, rule_id: str, after: str | None, limit: int
) -> tuple[list[Delivery], bool]:
    """A rule's deliveries, newest first, from after the delivery `after`."""
    query = select(NotificationDeliveryRow).where(NotificationDeliveryRow.rule_id == rule_id)
    if after is not None:
        anchor = session.get(NotificationDeliveryRow, after)
        if anchor is None or anchor.rule_id != rule_id:
            raise RuleError(404, f"after: delivery {after!r} not found", param="after")
        query = query.where(
            sa.or_(
                col(NotificationDeliveryRow.created_at) < anchor.created_at,
                sa.and_(
                    col(NotificationDeliveryRow.created_at) == anchor.created_at,
                    col(NotificationDeliveryRow.id) < anchor.id,
                ),
            )
        )
    query = query.order_by(
        col(NotificationDeliveryRow.created_at).desc(), col(NotificationDeliveryRow.id).desc()
    )
    rows = list(session.exec(query.limit(limit + 1)).all())
    return [to_api(session, row) for row in rows[:limit]], len(rows) > limit


def to_api(session: Session, row: NotificationDeliveryRow) -> Delivery:
    attempts = session.exec(
        select(NotificationAttemptRow)
        .where(NotificationAttemptRow.delivery_id == row.id)
        .order_by(col(NotificationAttemptRow.number))
    ).all()
    return Delivery.model_validate(
        {
            "id": row.id,
            "rule_id": row.rule_id,
            "event": row.event,
            "status": row.status,
            "created_at": _unix(row.created_at),
            "delivered_at": _unix(row.delivered_at),
            "next_attempt_at": _unix(row.next_attempt_at) if row.status == "pending" else None,
            "last_status_code": row.last_status_code,
            "last_error": row.last_error,
            "attempts": [
                DeliveryAttempt(
                    number=a.number,
                    started_at=int(a.started_at.timestamp()),
                    duration_ms=round(a.duration_ms, 1),
                    status_code=a.status_code,
                    error=a.error,
                    outcome=a.outcome,
                )
                for a in attempts
            ],
        }
    )


def later(now: datetime, seconds: float) -> datetime:
    return now + timedelta(seconds=seconds)


def _unix(moment: datetime | None) -> int | None:
    return None if moment is None else int(moment.timestamp())


def _table(model: type[Any]) -> sa.Table:
    table: sa.Table = model.__table__  # SQLModel sets it (table=True)
    return table

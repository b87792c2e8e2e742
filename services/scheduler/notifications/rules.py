"""The rules store: a tenant's notification rules, created, read, changed and deleted by that
tenant alone (another tenant's rule is as absent as a missing one: 404).

Pure data access over a sqlmodel Session. A rule's parts are checked together here (which
threshold goes with which event, where a URL may point), each refusal naming its field.
"""

from __future__ import annotations

import ipaddress
import json
import uuid
from urllib.parse import urlsplit

import sqlalchemy as sa
from pydantic import ValidationError
from sqlmodel import Session, col, delete, select

from services.scheduler.jobs import JobError
from services.scheduler.models import (
    NotificationAttemptRow,
    NotificationDeliveryRow,
    NotificationRuleRow,
)
from services.scheduler.notifications import signing
from services.scheduler.notifications.schemas import Rule, RuleCreate, RuleUpdate
from shared.db import utcnow

RULE_ID_PREFIX = "nr_"


class RuleError(JobError):
    """A request the notification rules API refuses: its status and the field named (mapped
    to a response with the jobs API's errors, once, in app.py)."""


def check_url(url: str, *, allow_http: bool) -> None:
    """Where a rule may send: http(s) with a host and no credentials; in production https
    only, and no loopback, private or link-local address written as such (a host name is not
    resolved here: egress rules are the operator's, docs/alerts.md)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise RuleError(422, "url: must be an http:// or https:// URL with a host", param="url")
    if parts.username or parts.password:
        raise RuleError(422, "url: credentials in the URL are refused", param="url")
    if allow_http:
        return
    if parts.scheme != "https":
        raise RuleError(422, "url: https:// only (http:// is for development)", param="url")
    if _internal(parts.hostname):
        raise RuleError(
            422, "url: a loopback, private or link-local address is refused", param="url"
        )


def _internal(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return not address.is_global


def create(
    session: Session, *, tenant: str, body: RuleCreate, allow_http: bool, server_secret: str
) -> Rule:
    _check(body, allow_http=allow_http)
    row = NotificationRuleRow(
        id=f"{RULE_ID_PREFIX}{uuid.uuid4().hex[:24]}",
        tenant=tenant,
        name=body.name,
        enabled=body.enabled,
        url=body.url,
        format=body.format,
        spec=_spec(body),
    )
    _save(session, row)
    return to_api(row, secret=secret_of(row, server_secret))


def listed(session: Session, *, tenant: str) -> list[Rule]:
    rows = session.exec(
        select(NotificationRuleRow)
        .where(NotificationRuleRow.tenant == tenant)
        .order_by(col(NotificationRuleRow.created_at), col(NotificationRuleRow.id))
    ).all()
    return [to_api(row) for row in rows]


def owned(session: Session, *, tenant: str, rule_id: str) -> NotificationRuleRow:
    row = session.get(NotificationRuleRow, rule_id)
    if row is None or row.tenant != tenant:
        raise RuleError(404, f"notification rule {rule_id!r} not found", param="rule_id")
    return row


def update(
    session: Session,
    *,
    tenant: str,
    rule_id: str,
    body: RuleUpdate,
    allow_http: bool,
    server_secret: str,
) -> Rule:
    row = owned(session, tenant=tenant, rule_id=rule_id)
    changes = body.model_dump(exclude_unset=True, exclude={"rotate_secret"})
    merged = spec_of(row).model_dump() | changes
    try:
        new = RuleCreate.model_validate(merged)
    except ValidationError as exc:  # only what the parts' bounds allow alone can get here
        error = exc.errors()[0]
        field = ".".join(str(part) for part in error["loc"]) or "body"
        raise RuleError(422, f"{field}: {error['msg']}", param=field) from None
    _check(new, allow_http=allow_http)
    row.name, row.enabled, row.url, row.format = new.name, new.enabled, new.url, new.format
    row.spec, row.updated_at = _spec(new), utcnow()
    if body.rotate_secret:
        row.secret_version += 1
    _save(session, row)
    return to_api(row, secret=secret_of(row, server_secret) if body.rotate_secret else None)


def remove(session: Session, *, tenant: str, rule_id: str) -> None:
    """The rule, its deliveries (pending ones are not sent) and their attempts."""
    row = owned(session, tenant=tenant, rule_id=rule_id)
    deliveries = select(NotificationDeliveryRow.id).where(NotificationDeliveryRow.rule_id == row.id)
    session.exec(
        delete(NotificationAttemptRow).where(
            col(NotificationAttemptRow.delivery_id).in_(deliveries)
        )
    )
    session.exec(
        delete(NotificationDeliveryRow).where(col(NotificationDeliveryRow.rule_id) == row.id)
    )
    session.delete(row)
    session.commit()


def enabled(
    session: Session, *, tenant: str | None = None
) -> list[tuple[NotificationRuleRow, RuleCreate]]:
    """Enabled rules (of one tenant, or every tenant's) with their parts."""
    query = select(NotificationRuleRow).where(col(NotificationRuleRow.enabled).is_(True))
    if tenant is not None:
        query = query.where(NotificationRuleRow.tenant == tenant)
    return [(row, spec_of(row)) for row in session.exec(query).all()]


def spec_of(row: NotificationRuleRow) -> RuleCreate:
    stored = json.loads(row.spec)
    return RuleCreate.model_validate(
        stored | {"name": row.name, "url": row.url, "format": row.format, "enabled": row.enabled}
    )


def secret_of(row: NotificationRuleRow, server_secret: str) -> str:
    return signing.secret_text(signing.rule_key(server_secret, row.id, row.secret_version))


def to_api(row: NotificationRuleRow, *, secret: str | None = None) -> Rule:
    spec = spec_of(row)
    return Rule(
        id=row.id,
        name=row.name,
        enabled=row.enabled,
        events=spec.events,
        url=row.url,
        format=spec.format,
        filter=spec.filter,
        stuck_after_minutes=spec.stuck_after_minutes,
        budget_percent=spec.budget_percent,
        created_at=int(row.created_at.timestamp()),
        updated_at=int(row.updated_at.timestamp()),
        secret=secret,
    )


def _check(body: RuleCreate, *, allow_http: bool) -> None:
    problem = body.incoherence()
    if problem is not None:
        field, why = problem
        raise RuleError(422, f"{field}: {why}", param=field)
    check_url(body.url, allow_http=allow_http)


def _spec(body: RuleCreate) -> bytes:
    parts = body.model_dump(
        mode="json",
        exclude_none=True,
        include={"events", "filter", "stuck_after_minutes", "budget_percent"},
    )
    return json.dumps(parts, separators=(",", ":")).encode()


def _save(session: Session, row: NotificationRuleRow) -> None:
    session.add(row)
    try:
        session.commit()
    except sa.exc.IntegrityError:
        session.rollback()
        raise RuleError(
            409, f"name: a notification rule named {row.name!r} exists", param="name"
        ) from None
    session.refresh(row)

"""HTTP routes of the notification rules API (the gateway relays /v1/notification_rules here
with the caller's key): a write key changes rules, a read key lists them and their deliveries,
and each tenant sees its own only."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request

from services.scheduler.notifications import outbox, rules
from services.scheduler.notifications.notifier import Notifier
from services.scheduler.notifications.schemas import (
    Delivery,
    DeliveryList,
    Rule,
    RuleCreate,
    RuleDeleted,
    RuleList,
    RuleUpdate,
)
from shared import auth
from shared.db import session_scope

router = APIRouter(prefix="/v1/notification_rules", tags=["notifications"])
Reader = Annotated[auth.Principal, Depends(auth.require_access)]
MAX_PAGE = 100


async def get_notifier(request: Request) -> Notifier:
    notifier: Notifier = request.app.state.notifier
    return notifier


NotifierDep = Annotated[Notifier, Depends(get_notifier)]


@router.post("", response_model=Rule, summary="Create a notification rule")
def create_rule(body: RuleCreate, principal: auth.WriterDep, notifier: NotifierDep) -> Rule:
    """The answer carries the rule's signing `secret`, once: keep it where the receiver
    verifies signatures (docs/alerts.md)."""
    with session_scope(notifier.engine) as session:
        return rules.create(
            session,
            tenant=principal.tenant_id,
            body=body,
            allow_http=notifier.allow_http,
            server_secret=notifier.server_secret,
        )


@router.get("", response_model=RuleList, summary="The tenant's notification rules")
def list_rules(principal: Reader, notifier: NotifierDep) -> RuleList:
    with session_scope(notifier.engine) as session:
        return RuleList(data=rules.listed(session, tenant=principal.tenant_id))


@router.get("/{rule_id}", response_model=Rule, summary="A notification rule")
def get_rule(rule_id: str, principal: Reader, notifier: NotifierDep) -> Rule:
    with session_scope(notifier.engine) as session:
        return rules.to_api(rules.owned(session, tenant=principal.tenant_id, rule_id=rule_id))


@router.patch("/{rule_id}", response_model=Rule, summary="Change a notification rule")
def update_rule(
    rule_id: str, body: RuleUpdate, principal: auth.WriterDep, notifier: NotifierDep
) -> Rule:
    """Fields given replace the rule's. `rotate_secret: true` answers with a new secret; the
    old one stops signing at once (retries of pending deliveries included)."""
    with session_scope(notifier.engine) as session:
        return rules.update(
            session,
            tenant=principal.tenant_id,
            rule_id=rule_id,
            body=body,
            allow_http=notifier.allow_http,
            server_secret=notifier.server_secret,
        )


@router.delete("/{rule_id}", response_model=RuleDeleted, summary="Delete a notification rule")
def delete_rule(rule_id: str, principal: auth.WriterDep, notifier: NotifierDep) -> RuleDeleted:
    """Its pending deliveries are not sent; its history goes with it."""
    with session_scope(notifier.engine) as session:
        rules.remove(session, tenant=principal.tenant_id, rule_id=rule_id)
    return RuleDeleted(id=rule_id)


@router.get(
    "/{rule_id}/deliveries",
    response_model=DeliveryList,
    summary="A rule's deliveries, newest first: attempts, status codes, next retry",
)
def list_deliveries(
    rule_id: str,
    principal: Reader,
    notifier: NotifierDep,
    after: Annotated[str | None, Query(max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 20,
) -> DeliveryList:
    with session_scope(notifier.engine) as session:
        rule = rules.owned(session, tenant=principal.tenant_id, rule_id=rule_id)
        data, more = outbox.page(session, rule_id=rule.id, after=after, limit=limit)
        return DeliveryList(data=data, has_more=more)


@router.post(
    "/{rule_id}/test",
    response_model=Delivery,
    summary="Send the rule a signed test notification",
)
async def send_test(rule_id: str, principal: auth.WriterDep, notifier: NotifierDep) -> Delivery:
    """A delivery of event `test` to the rule's URL, signed with its secret and sent through
    the outbox like any alert (retried alike), enabled or not. The answer is the delivery
    after its first attempt (`status`, `attempts`: the receiver's status code or the error),
    or still `pending` when the sender did not get to it within a request's timeout."""
    return await notifier.send_test(tenant=principal.tenant_id, rule_id=rule_id)

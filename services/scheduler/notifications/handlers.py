"""Event subscribers of the notifier: every fact that can be an alert (matching.SOURCES), on
durable consumers of their own, so notifications neither wait for nor hold up the jobs'."""

from __future__ import annotations

from faststream.nats import NatsRouter

from services.scheduler.notifications.matching import SOURCES
from services.scheduler.notifications.notifier import Notifier
from shared import bus
from shared.events import Event

SERVICE = "scheduler-notifications"


def build_router(notifier: Notifier) -> NatsRouter:
    router = NatsRouter()
    for event_cls in SOURCES:
        _subscribe(router, event_cls, notifier)
    return router


def _subscribe(router: NatsRouter, event_cls: type[Event], notifier: Notifier) -> None:
    async def take(event: Event) -> None:
        await notifier.on_event(event)

    # FastStream validates the message against the handler's annotation.
    take.__annotations__["event"] = event_cls
    take.__name__ = f"notify_{event_cls.event_name.replace('.', '_')}"
    bus.subscribe(router, event_cls, service=SERVICE)(take)

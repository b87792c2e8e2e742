"""The notifier: facts in (bus events, checks), deliveries out.

A fact that is an alert is matched against its tenant's enabled rules and one delivery per
matching rule is written to the outbox, in one transaction, before the bus event is acked;
the dispatcher, woken at once, sends them. Checks run every `check_interval_s`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable
from datetime import datetime

import httpx
from sqlalchemy.engine import Engine
from sqlmodel import Session

from services.scheduler.config import NotificationSettings
from services.scheduler.ladder import ProviderPool
from services.scheduler.models import JobRow, NotificationDeliveryRow, NotificationRuleRow
from services.scheduler.notifications import bodies, checks, metrics, outbox, rules
from services.scheduler.notifications.delivery import Dispatcher
from services.scheduler.notifications.matching import Alert, alert_of, matches, probe
from services.scheduler.notifications.schemas import Delivery, RuleCreate
from shared.db import session_scope, utcnow
from shared.events import Event, JobEvent, TrainingBudgetThresholdReached

log = logging.getLogger("tuneloop.scheduler.notifications")
Publish = Callable[[Event], Awaitable[None]]


class Notifier:
    def __init__(
        self,
        *,
        engine: Engine,
        settings: NotificationSettings,
        server_secret: str,
        allow_http: bool,
        publish: Publish,
        pool: ProviderPool,
        platform_cap: float | None,
        client: httpx.AsyncClient | None = None,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.engine, self.settings, self.clock = engine, settings, clock
        self.server_secret, self.allow_http = server_secret, allow_http
        self.publish, self.pool, self.platform_cap = publish, pool, platform_cap
        self.dispatcher = Dispatcher(engine, settings, server_secret, client=client, clock=clock)
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    # --- facts in ---------------------------------------------------------------------------

    async def on_event(self, event: Event) -> None:
        """A bus event: its deliveries are in the outbox when this returns (then acked)."""
        alert = await asyncio.to_thread(self._take, event)
        if alert is not None:
            metrics.ALERTS.add(1, {"event": alert.event})
            log.info("alert %s for tenant %s: %s", alert.event, alert.tenant, alert.title)
            self._wake.set()

    def _take(self, event: Event) -> Alert | None:
        with session_scope(self.engine) as session:
            job = session.get(JobRow, event.job_id) if isinstance(event, JobEvent) else None
            alert = alert_of(event, suffix=job.suffix if job is not None else None)
            if alert is not None:
                self._enqueue(session, [alert])
            return alert

    def _enqueue(self, session: Session, alerts: list[Alert]) -> int:
        by_tenant: dict[str, list[tuple[NotificationRuleRow, RuleCreate]]] = {}
        added = 0
        for alert in alerts:
            if alert.tenant not in by_tenant:
                by_tenant[alert.tenant] = rules.enabled(session, tenant=alert.tenant)
            for row, spec in by_tenant[alert.tenant]:
                if matches(spec, alert):
                    added += self._add(session, row, alert) is not None
        session.commit()
        return added

    async def send_test(self, *, tenant: str, rule_id: str) -> Delivery:
        """A signed `test` delivery to the rule's URL (enabled or not), through the outbox like
        any alert; returned after its first attempt, or as it stands once a request's timeout
        has passed (the sender busy with others)."""
        delivery_id = await asyncio.to_thread(self._enqueue_test, tenant, rule_id)
        self._wake.set()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.timeout_s + 1.0
        while True:
            delivery = await asyncio.to_thread(self._delivery, delivery_id)
            if delivery.attempts or loop.time() >= deadline:
                return delivery
            await asyncio.sleep(0.05)

    def _enqueue_test(self, tenant: str, rule_id: str) -> str:
        with session_scope(self.engine) as session:
            row = rules.owned(session, tenant=tenant, rule_id=rule_id)
            alert = probe(tenant=tenant, rule_id=row.id, rule_name=row.name, now=self.clock())
            message_id = self._add(session, row, alert)
            session.commit()
            assert message_id is not None  # its key is new: nothing to collide with
            return message_id

    def _delivery(self, delivery_id: str) -> Delivery:
        with session_scope(self.engine) as session:
            row = session.get(NotificationDeliveryRow, delivery_id)
            if row is None:  # the rule was deleted meanwhile
                raise rules.RuleError(404, f"delivery {delivery_id!r} not found", param="rule_id")
            return outbox.to_api(session, row)

    def _add(self, session: Session, row: NotificationRuleRow, alert: Alert) -> str | None:
        """The delivery's id, or None when the rule has one for this alert already."""
        message_id = outbox.new_message_id()
        body = bodies.render(
            row.format,  # type: ignore[arg-type]  # written from Format only
            alert,
            message_id=message_id,
            rule_id=row.id,
            rule_name=row.name,
        )
        added = outbox.enqueue(
            session,
            rule=row,
            event=alert.event,
            key=alert.key,
            message_id=message_id,
            body=body,
            now=self.clock(),
        )
        return message_id if added else None

    async def check(self) -> None:
        """Stuck jobs to the outbox; budget percentages reached to the bus (their events come
        back as facts like any other), each marked once published."""
        reached = await asyncio.to_thread(self._look)
        for event in reached:
            await self.publish(event)
            await asyncio.to_thread(self._mark, event)
        self._wake.set()

    def _look(self) -> list[TrainingBudgetThresholdReached]:
        now = self.clock()
        with session_scope(self.engine) as session:
            found = checks.silences(session)
            metrics.set_progress(
                {(s.job.tenant, s.job.id): s.last_progress.timestamp() for s in found}
            )
            self._enqueue(session, checks.stuck_alerts(found, now))
            wanted: dict[str, set[int]] = defaultdict(set)
            for row, spec in rules.enabled(session):
                if "budget.nearly_spent" in spec.events:
                    wanted[row.tenant].add(spec.budget_threshold())
            state = checks.budget_check(
                session, self.pool, platform_cap=self.platform_cap, wanted=wanted, now=now
            )
            metrics.set_budget(state.ratios)
            return state.reached

    def _mark(self, event: TrainingBudgetThresholdReached) -> None:
        with session_scope(self.engine) as session:
            checks.mark_published(session, event)

    # --- running ----------------------------------------------------------------------------

    async def start(self) -> None:
        metrics.prime()
        self._tasks = [
            asyncio.create_task(self._delivering(), name="notifications-delivery"),
            asyncio.create_task(self._checking(), name="notifications-checks"),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.dispatcher.aclose()

    async def _delivering(self) -> None:
        while True:
            try:
                sent = await self.dispatcher.send_due()
            except Exception:  # the database away, say: said, and tried again next round
                log.exception("sending notifications failed")
                sent = 0
            if sent:
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.settings.poll_interval_s)
            self._wake.clear()

    async def _checking(self) -> None:
        while True:
            try:
                await self.check()
            except Exception:  # said, and tried again next round
                log.exception("checking stuck jobs and budgets failed")
            await asyncio.sleep(self.settings.check_interval_s)

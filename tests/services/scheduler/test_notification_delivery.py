"""Notification delivery on a real database (SQLite and PostgreSQL) to a real HTTP receiver:
retries until delivered, Retry-After, final refusals, giving up, a restart mid-retry, and the
checks that find stuck jobs and budget percentages. The bus and the API on real processes:
test_notifications_api.py."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy.engine import Engine

from services.scheduler.config import NotificationSettings
from services.scheduler.ladder import ProviderPool, load_ladder
from services.scheduler.models import AttemptRow, JobRow, TenantBudgetRow
from services.scheduler.notifications import outbox, rules
from services.scheduler.notifications.notifier import Notifier
from services.scheduler.notifications.schemas import Delivery, Rule, RuleCreate
from shared.db import session_scope, utcnow
from shared.events import CaptureSpilled, Event, JobFailed, TrainingBudgetThresholdReached
from tests.fakes.webhook_receiver import Receiver, running_receiver, verify
from tests.plugins.infra import free_port

SECRET = "scheduler-secret-for-tests"
# The receiver serves the whole module: each test's paths are its own (a run per backend).
_RUN: dict[str, str] = {}
FAST = NotificationSettings(backoff_s=0.05, max_backoff_s=5, max_attempts=4, timeout_s=5)


@pytest.fixture(autouse=True)
def _paths_of_its_own() -> None:
    _RUN["prefix"] = uuid.uuid4().hex[:8]


def _path(name: str) -> str:
    return f"/{_RUN['prefix']}/{name}"


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with running_receiver() as running:
        yield running


class Published(list[Event]):
    async def __call__(self, event: Event) -> None:
        self.append(event)


def _notifier(engine: Engine, published: Published | None = None, **settings: Any) -> Notifier:
    return Notifier(
        engine=engine,
        settings=FAST.model_copy(update=settings),
        server_secret=SECRET,
        allow_http=True,
        publish=published if published is not None else Published(),
        pool=ProviderPool(load_ladder(None)),
        platform_cap=None,
    )


@pytest.fixture
async def notifier(db_engine: Engine) -> AsyncIterator[Notifier]:
    made = _notifier(db_engine)
    yield made
    await made.dispatcher.aclose()


def _rule(engine: Engine, url: str, tenant: str = "acme", **parts: Any) -> Rule:
    body = RuleCreate.model_validate({"name": url.rsplit("/", 1)[-1], "url": url} | parts)
    with session_scope(engine) as session:
        return rules.create(
            session, tenant=tenant, body=body, allow_http=True, server_secret=SECRET
        )


def _deliveries(engine: Engine, rule: Rule) -> list[Delivery]:
    with session_scope(engine) as session:
        return outbox.page(session, rule_id=rule.id, after=None, limit=100)[0]


async def _until_settled(notifier: Notifier, rule: Rule, timeout_s: float = 15.0) -> Delivery:
    """Send what is due until the rule's one delivery is delivered or failed."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        await notifier.dispatcher.send_due()
        (delivery,) = _deliveries(notifier.engine, rule)
        if delivery.status != "pending":
            return delivery
        assert asyncio.get_running_loop().time() < deadline, delivery
        await asyncio.sleep(0.02)


def _failed(job: str = "ftjob-1", tenant: str = "acme") -> JobFailed:
    return JobFailed(tenant=tenant, job_id=job, reason="nan_loss", message="loss became NaN")


async def test_a_receiver_that_fails_twice_gets_it_on_the_third_attempt_signed_each_time(
    notifier: Notifier, receiver: Receiver
) -> None:
    rule = _rule(notifier.engine, receiver.answer(_path("twice"), 503, 500), events=["job.failed"])
    assert rule.secret is not None
    await notifier.on_event(_failed())

    delivery = await _until_settled(notifier, rule)
    assert delivery.status == "delivered"
    assert [(a.number, a.status_code, a.outcome) for a in delivery.attempts] == [
        (1, 503, "retry"),
        (2, 500, "retry"),
        (3, 200, "delivered"),
    ]
    got = receiver.at(_path("twice"))
    assert len(got) == 3
    assert {r.headers["webhook-id"] for r in got} == {delivery.id}  # receivers dedupe on it
    assert {r.body for r in got} == {got[0].body}
    for request in got:
        verify(rule.secret, request.headers, request.body)
    body = got[0].json()
    assert (body["type"], body["id"], body["data"]["job_id"]) == (
        "job.failed",
        delivery.id,
        "ftjob-1",
    )


async def test_retry_after_is_honoured_a_refusal_is_final_and_retries_end(
    notifier: Notifier, receiver: Receiver
) -> None:
    later = _rule(
        notifier.engine,
        receiver.answer(_path("later"), (429, {"Retry-After": "1"})),
        events=["job.failed"],
    )
    refused = _rule(notifier.engine, receiver.answer(_path("refused"), 400), events=["job.failed"])
    down = _rule(
        notifier.engine, receiver.answer(_path("down"), *[503] * 10), events=["job.failed"]
    )
    await notifier.on_event(_failed())

    delivered = await _until_settled(notifier, later)
    first, second = receiver.at(_path("later"))
    assert second.at - first.at >= 0.9  # not 0.05 s: the receiver asked for a second
    assert [a.outcome for a in delivered.attempts] == ["retry", "delivered"]

    final = await _until_settled(notifier, refused)
    assert (final.status, len(final.attempts), final.last_status_code) == ("failed", 1, 400)
    assert final.next_attempt_at is None

    given_up = await _until_settled(notifier, down)
    assert given_up.status == "failed"
    assert [a.status_code for a in given_up.attempts] == [503] * FAST.max_attempts
    assert [a.outcome for a in given_up.attempts] == ["retry"] * 3 + ["failed"]
    assert len(receiver.at(_path("down"))) == FAST.max_attempts


async def test_no_answer_in_time_or_at_all_is_retried(
    db_engine: Engine, receiver: Receiver
) -> None:
    notifier = _notifier(db_engine, timeout_s=0.3)
    slow_path = _path("slow")
    receiver.delays[slow_path] = 2.0
    slow = _rule(db_engine, receiver.answer(slow_path), events=["job.failed"])
    closed = _rule(db_engine, f"http://127.0.0.1:{free_port()}/hook", events=["job.failed"])
    await notifier.on_event(_failed())
    started = time.monotonic()
    try:
        assert await notifier.dispatcher.send_due() == 2
    finally:
        await notifier.dispatcher.aclose()
    assert time.monotonic() - started < 1.5  # the timeout, not the receiver, ended it
    for rule, error in ((slow, "TimeoutError"), (closed, "ConnectError")):
        (delivery,) = _deliveries(db_engine, rule)
        (attempt,) = delivery.attempts
        assert (delivery.status, attempt.status_code, attempt.outcome) == ("pending", None, "retry")
        assert attempt.error is not None
        assert attempt.error.startswith(error)


async def test_a_restart_mid_retry_still_delivers(db_engine: Engine, receiver: Receiver) -> None:
    first = _notifier(db_engine, backoff_s=0.3)
    rule = _rule(db_engine, receiver.answer(_path("restart"), 503), events=["job.failed"])
    await first.on_event(_failed())
    assert await first.dispatcher.send_due() == 1
    (pending,) = _deliveries(db_engine, rule)
    assert (pending.status, pending.last_status_code) == ("pending", 503)
    assert pending.next_attempt_at is not None
    await first.dispatcher.aclose()  # the process is gone; only the database remains

    second = _notifier(db_engine)
    try:
        delivered = await _until_settled(second, rule)
    finally:
        await second.dispatcher.aclose()
    assert [a.status_code for a in delivered.attempts] == [503, 200]
    assert len({r.headers["webhook-id"] for r in receiver.at(_path("restart"))}) == 1


async def test_a_fact_reaches_each_matching_rule_of_its_tenant_once(
    notifier: Notifier, receiver: Receiver
) -> None:
    mine = _rule(notifier.engine, receiver.answer(_path("mine")), events=["job.failed"])
    filtered = _rule(
        notifier.engine,
        receiver.answer(_path("other-suffix")),
        events=["job.failed"],
        filter={"suffix": "support"},
    )
    theirs = _rule(
        notifier.engine, receiver.answer(_path("theirs")), tenant="globex", events=["job.failed"]
    )
    event = _failed()
    await notifier.on_event(event)
    await notifier.on_event(event)  # redelivered by the bus: nothing twice
    assert len(_deliveries(notifier.engine, mine)) == 1
    assert _deliveries(notifier.engine, filtered) == []  # the job has no suffix "support"
    assert _deliveries(notifier.engine, theirs) == []


async def test_a_spill_episode_reaches_the_rules_of_the_tenants_it_names(
    notifier: Notifier, receiver: Receiver
) -> None:
    acme = _rule(notifier.engine, receiver.answer(_path("spill-acme")), events=["capture.spilling"])
    other = _rule(notifier.engine, receiver.answer(_path("spill-jobs")), events=["job.failed"])
    globex = _rule(
        notifier.engine,
        receiver.answer(_path("spill-globex")),
        tenant="globex",
        events=["capture.spilling"],
    )
    now = utcnow()
    spilled = CaptureSpilled(
        tenant="acme",
        started_at=now - timedelta(seconds=40),
        ended_at=now,
        samples=5,
        bytes=9000,
        max_backlog_fraction=0.001,
    )
    await notifier.on_event(spilled)
    await notifier.on_event(spilled)  # the same episode published twice: one delivery

    delivery = await _until_settled(notifier, acme)
    assert (delivery.event, delivery.status) == ("capture.spilling", "delivered")
    (request,) = receiver.at(_path("spill-acme"))
    assert acme.secret is not None
    verify(acme.secret, request.headers, request.body)
    body = request.json()
    assert (body["type"], body["tenant"], body["data"]["samples"]) == (
        "capture.spilling",
        "acme",
        5,
    )
    assert body["title"] == "Capture held 5 of your samples back for 40 s"
    assert _deliveries(notifier.engine, other) == []
    assert _deliveries(notifier.engine, globex) == []  # its samples were not in this one


def _running_job(engine: Engine, job_id: str, *, silent_for: timedelta, suffix: str | None) -> None:
    now = utcnow()
    with session_scope(engine) as session:
        session.add(
            JobRow(
                id=job_id,
                tenant="acme",
                status="running",
                model="m",
                training_file="file-1",
                suffix=suffix,
                request=b"{}",
            )
        )
        session.add(
            AttemptRow(
                id=f"{job_id}-a1",
                job_id=job_id,
                number=1,
                provider="local",
                ref="1:1",
                work_dir="/tmp/x",
                state="running",
                started_at=now - silent_for - timedelta(minutes=5),
                last_report_at=now - silent_for,
                last_step=12,
            )
        )


async def test_a_job_silent_past_a_rules_minutes_is_stuck_once(
    notifier: Notifier, receiver: Receiver
) -> None:
    thirty = _rule(notifier.engine, receiver.answer(_path("stuck-30")), events=["job.stuck"])
    hour = _rule(
        notifier.engine,
        receiver.answer(_path("stuck-60")),
        events=["job.stuck"],
        stuck_after_minutes=60,
    )
    _running_job(notifier.engine, "ftjob-quiet", silent_for=timedelta(minutes=40), suffix="desk")
    _running_job(notifier.engine, "ftjob-busy", silent_for=timedelta(seconds=20), suffix="desk")

    await notifier.check()
    await notifier.check()  # the same silence: no second alert
    delivered = await _until_settled(notifier, thirty)
    assert delivered.event == "job.stuck"
    (request,) = receiver.at(_path("stuck-30"))
    body = request.json()
    assert (body["data"]["job_id"], body["data"]["step"]) == ("ftjob-quiet", 12)
    assert 39 * 60 < body["data"]["idle_s"] < 41 * 60
    assert _deliveries(notifier.engine, hour) == []


async def test_budget_percentages_are_published_once_and_reach_the_rule_that_names_one(
    db_engine: Engine, receiver: Receiver
) -> None:
    published = Published()
    notifier = _notifier(db_engine, published)
    eighty = _rule(db_engine, receiver.answer(_path("budget-80")), events=["budget.nearly_spent"])
    ninety = _rule(
        db_engine,
        receiver.answer(_path("budget-90")),
        events=["budget.nearly_spent"],
        budget_percent=90,
    )
    now = utcnow()
    with session_scope(db_engine) as session:
        session.add(TenantBudgetRow(tenant="acme", monthly_cost_cap=10.0))
        session.add(
            JobRow(
                id="ftjob-paid",
                tenant="acme",
                status="succeeded",
                model="m",
                training_file="file-1",
                request=b"{}",
            )
        )
        # 51 minutes at 10 USD an hour: 8.50 of the 10.00 cap (85 %), this month.
        session.add(
            AttemptRow(
                id="paid-a1",
                job_id="ftjob-paid",
                number=1,
                provider="local",
                ref="1:1",
                work_dir="/tmp/x",
                state="exited",
                cost_per_hour=10.0,
                device_count=1,
                started_at=now - timedelta(minutes=51),
                ended_at=now,
            )
        )
    try:
        await notifier.check()
        assert [e.percent for e in published] == [50, 80]  # type: ignore[attr-defined]
        await notifier.check()
        assert len(published) == 2  # once a month
        for event in published:  # as the bus brings them back
            assert isinstance(event, TrainingBudgetThresholdReached)
            await notifier.on_event(event)
        delivered = await _until_settled(notifier, eighty)
    finally:
        await notifier.dispatcher.aclose()
    (request,) = receiver.at(_path("budget-80"))
    assert request.json()["data"]["percent"] == 80
    assert delivered.event == "budget.nearly_spent"
    assert _deliveries(db_engine, ninety) == []

"""Notification rules on real processes: nats-server (the module's own), SeaweedFS, SQLite,
ingest (the gateway every call goes through) and the scheduler; a webhook receiver in a thread.
Facts published on the bus as their producers publish them reach the tenant's rules signed,
as our JSON or a Slack body; a budget's percentage is found, published and delivered by the
scheduler alone; a scheduler killed mid-retry delivers after its restart. The API is scoped
to the tenant and refuses bad rules naming the field."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import httpx
import pytest

from services.scheduler.models import AttemptRow, JobRow
from shared import bus, db
from shared.db import session_scope, utcnow
from shared.dev import localstack
from shared.events import (
    CanaryFailed,
    CaptureSpilled,
    DeploymentRolledBack,
    EvalDecided,
    Event,
    JobFailed,
)
from shared.settings import Settings
from tests.fakes.webhook_receiver import Receiver, running_receiver, verify
from tests.plugins.infra import RunningProcess, free_port, make_settings, settings_env

ADMIN = {"Authorization": "Bearer tuneloop-dev-admin"}
RULES = "/v1/notification_rules"


@dataclass
class Stack:
    settings: Settings
    gateway: str
    scheduler: RunningProcess
    receiver: Receiver
    keys: dict[str, dict[str, str]]  # "<tenant>:<scope>" -> headers

    def call(self, who: str, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return httpx.request(
            method, self.gateway + path, headers=self.keys[who], timeout=30, **kwargs
        )

    def rule(self, who: str, **body: Any) -> dict[str, Any]:
        body = {"name": f"rule-{uuid.uuid4().hex[:8]}"} | body
        response = self.call(who, "POST", RULES, json=body)
        assert response.status_code == 200, response.text
        created: dict[str, Any] = response.json()
        return created

    def deliveries(self, rule_id: str, who: str = "acme:read") -> list[dict[str, Any]]:
        response = self.call(who, "GET", f"{RULES}/{rule_id}/deliveries")
        assert response.status_code == 200, response.text
        data: list[dict[str, Any]] = response.json()["data"]
        return data

    def until(self, rule_id: str, done: Any, timeout_s: float = 20.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout_s
        while not done(found := self.deliveries(rule_id)):
            assert time.monotonic() < deadline, found
            time.sleep(0.1)
        return found


def _key(url: str, tenant: str, scope: str) -> dict[str, str]:
    httpx.post(f"{url}/v1/admin/tenants", json={"id": tenant, "name": tenant}, headers=ADMIN)
    response = httpx.post(
        f"{url}/v1/admin/tenants/{tenant}/api_keys",
        json={"name": scope, "scope": scope},
        headers=ADMIN,
    )
    assert response.status_code == 201, response.text
    return {"Authorization": f"Bearer {response.json()['key']}"}


@pytest.fixture(scope="module")
def stack(
    s3_server: RunningProcess, stack_settings: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("notifications")
    # A nats-server of the module's own: the facts it publishes reach no other test's consumers.
    settings = make_settings(
        tmp, infra=stack_settings, nats={"port": free_port(), "monitor_port": free_port()}
    )
    db.migrate(settings.database_url)
    env = settings_env(settings) | {
        "TUNELOOP_SCHEDULER_NOTIFY_BACKOFF_S": "0.3",
        "TUNELOOP_SCHEDULER_NOTIFY_MAX_ATTEMPTS": "50",
        "TUNELOOP_SCHEDULER_NOTIFY_CHECK_INTERVAL_S": "0.5",
        "TUNELOOP_SCHEDULER_NOTIFY_POLL_INTERVAL_S": "0.2",
    }
    processes = [
        RunningProcess(localstack.component(settings, name), tmp / "logs" / f"{name}.log", env=env)
        for name in ("nats", "ingest", "scheduler")
    ]
    try:
        for process in processes:
            process.start(timeout_s=90)
        url = f"http://127.0.0.1:{settings.services.ingest_port}"
        keys = {f"{t}:{s}": _key(url, t, s) for t in ("acme", "globex") for s in ("write", "read")}
        keys["acme:admin"] = _key(url, "acme", "admin")
        with running_receiver() as receiver:
            yield Stack(settings, url, processes[2], receiver, keys)
        # Nothing went wrong that a retry hid (the receiver's refusals are warnings).
        errors = [
            line
            for process in processes[1:]
            for line in process.log().splitlines()
            if '"level":"ERROR"' in line and '.faststream"' not in line
        ]
        assert not errors, errors
    finally:
        for process in reversed(processes):
            process.stop()


def test_rules_are_the_tenants_own_and_bad_ones_are_refused_naming_the_field(stack: Stack) -> None:
    url = stack.receiver.answer("/api")
    created = stack.rule(
        "acme:write",
        name="on-call",
        events=["job.failed", "job.stuck"],
        url=url,
        stuck_after_minutes=45,
    )
    assert created["secret"].startswith("whsec_")
    assert created["object"] == "notification_rule"
    rule_id = created["id"]
    shown = stack.call("acme:read", "GET", f"{RULES}/{rule_id}").json()
    assert shown["secret"] is None  # given once, at create
    assert (shown["events"], shown["stuck_after_minutes"]) == (["job.failed", "job.stuck"], 45)
    listed = stack.call("acme:read", "GET", RULES).json()["data"]
    assert rule_id in [r["id"] for r in listed]
    assert (
        stack.call(
            "acme:read", "POST", RULES, json={"name": "x", "events": ["job.failed"], "url": url}
        ).status_code
        == 403
    )

    for method, path in [("GET", ""), ("PATCH", ""), ("DELETE", ""), ("GET", "/deliveries")]:
        answer = stack.call(
            "globex:write",
            method,
            f"{RULES}/{rule_id}{path}",
            **({"json": {"enabled": False}} if method == "PATCH" else {}),
        )
        assert answer.status_code == 404, (method, path, answer.text)
        assert rule_id in answer.json()["error"]["message"]
    assert rule_id not in [r["id"] for r in stack.call("globex:read", "GET", RULES).json()["data"]]

    refused = [
        ({"events": ["job.failed"], "url": "ftp://hooks.example.com/x"}, "url"),
        ({"events": ["job.exploded"], "url": url}, "events.0"),
        ({"events": [], "url": url}, "events"),
        ({"events": ["job.failed"], "url": url, "stuck_after_minutes": 5}, "stuck_after_minutes"),
        ({"events": ["job.failed"], "url": url, "budget_percent": 101}, "budget_percent"),
        ({"events": ["job.failed"], "url": url, "format": "teams"}, "format"),
        ({"events": ["job.failed"], "url": url, "secret": "mine"}, "secret"),
    ]
    for body, field in refused:
        answer = stack.call("acme:write", "POST", RULES, json={"name": "bad"} | body)
        assert answer.status_code == 422, (body, answer.text)
        assert answer.json()["error"]["param"] == field, (body, answer.text)
        assert field in answer.json()["error"]["message"]
    taken = stack.call(
        "acme:write", "POST", RULES, json={"name": "on-call", "events": ["job.failed"], "url": url}
    )
    assert (taken.status_code, taken.json()["error"]["param"]) == (409, "name")
    patched = stack.call(
        "acme:write", "PATCH", f"{RULES}/{rule_id}", json={"events": ["job.failed"]}
    )
    assert (patched.status_code, patched.json()["error"]["param"]) == (422, "stuck_after_minutes")

    rotated = stack.call(
        "acme:write", "PATCH", f"{RULES}/{rule_id}", json={"rotate_secret": True, "format": "slack"}
    ).json()
    assert rotated["secret"].startswith("whsec_")
    assert rotated["secret"] != created["secret"]
    assert rotated["format"] == "slack"
    assert stack.call("acme:write", "DELETE", f"{RULES}/{rule_id}").json()["deleted"] is True
    assert stack.call("acme:read", "GET", f"{RULES}/{rule_id}").status_code == 404


def _publish(settings: Settings, *events: Event) -> None:
    """As the producers (scheduler, evaluator, hoster) publish them: the bus, typed."""

    async def send() -> None:
        broker = bus.make_broker(settings.nats, service="test-producer")
        await bus.connect(broker, settings.nats)
        try:
            for event in events:
                await bus.publish(broker, event)
        finally:
            await broker.stop()

    asyncio.run(send())


def _decided(tenant: str, gate: str) -> EvalDecided:
    return EvalDecided(
        tenant=tenant,
        job_id="ftjob-e",
        base_model="SmolLM2-135M-Instruct",
        fine_tuned_model="ft:SmolLM2-135M-Instruct::ftjob-e",
        dataset_id="ds",
        dataset_version="v",
        best_step=8,
        best_checkpoint_uri="s3://b/c",
        best_score=0.2,
        base_score=0.5,
        gate=gate,
        gate_reason="0.200 does not beat the base's 0.500",
    )


def test_bus_facts_reach_the_tenants_rules_signed_as_json_or_slack(stack: Stack) -> None:
    receiver = stack.receiver
    ours = stack.rule(
        "acme:write",
        url=receiver.answer("/json"),
        events=["job.failed", "eval.gate_failed", "deployment.unhealthy"],
    )
    slack = stack.rule(
        "acme:write",
        url=receiver.answer("/slack"),
        format="slack",
        events=["deployment.rolled_back"],
        filter={"served_name": "billing-desk"},
    )
    theirs = stack.rule(
        "globex:write",
        url=receiver.answer("/globex"),
        events=["job.failed", "deployment.rolled_back"],
    )
    _publish(
        stack.settings,
        JobFailed(tenant="acme", job_id="ftjob-f", reason="oom", message="CUDA out of memory"),
        _decided("acme", "passed"),  # not an alert
        _decided("acme", "rejected"),
        CanaryFailed(
            tenant="acme",
            name="billing-desk",
            revision=2,
            deployment_id="dep-c",
            requests=50,
            errors=8,
            reason="error rate 0.16 > 0.05",
        ),
        DeploymentRolledBack(tenant="acme", deployment_id="dep-c", name="support", reason="x"),
        DeploymentRolledBack(
            tenant="acme",
            deployment_id="dep-c",
            name="billing-desk",
            restored_deployment_id="dep-a",
            reason="canary error rate",
        ),
    )

    got = receiver.wait_for("/json", 3)
    for request in got:
        verify(ours["secret"], request.headers, request.body)
    assert sorted(r.json()["type"] for r in got) == [
        "deployment.unhealthy",
        "eval.gate_failed",
        "job.failed",
    ]
    failed = next(r.json() for r in got if r.json()["type"] == "job.failed")
    assert (failed["tenant"], failed["data"]["message"]) == ("acme", "CUDA out of memory")

    (posted,) = receiver.wait_for("/slack", 1)
    verify(slack["secret"], posted.headers, posted.body)
    body = posted.json()
    assert set(body) == {"text", "blocks"}
    assert body["text"].startswith("billing-desk rolled back")
    assert [block["type"] for block in body["blocks"]] == ["header", "section", "context"]

    delivered = stack.until(
        ours["id"], lambda d: len(d) == 3 and all(x["status"] == "delivered" for x in d)
    )
    assert all([a["status_code"] for a in d["attempts"]] == [200] for d in delivered)
    time.sleep(1.0)  # anything wrongly routed would have arrived by now
    assert len(receiver.at("/slack")) == 1  # the rollback of "support" is filtered out
    assert receiver.at("/globex") == []  # another tenant's facts never reach it
    assert stack.deliveries(theirs["id"], who="globex:read") == []

    metrics = httpx.get(f"http://127.0.0.1:{stack.settings.services.scheduler_port}/metrics").text
    assert 'tuneloop_alerts_total{event="job.failed"' in metrics
    assert "tuneloop_notification_deliveries_total{" in metrics


def test_a_spill_episode_on_the_bus_reaches_the_rules_of_its_tenant(stack: Stack) -> None:
    rule = stack.rule(
        "acme:write", url=stack.receiver.answer("/spill"), events=["capture.spilling"]
    )
    now = utcnow()
    episode = {"started_at": now - timedelta(minutes=3), "ended_at": now, "bytes": 4000}
    _publish(
        stack.settings,
        CaptureSpilled(tenant="acme", samples=9, max_backlog_fraction=0.01, **episode),
        CaptureSpilled(tenant="globex", samples=2, max_backlog_fraction=0.01, **episode),
    )
    (request,) = stack.receiver.wait_for("/spill", 1)
    verify(rule["secret"], request.headers, request.body)
    body = request.json()
    assert (body["type"], body["tenant"], body["data"]["samples"]) == (
        "capture.spilling",
        "acme",
        9,
    )
    assert body["title"] == "Capture held 9 of your samples back for 3 min"


def test_the_scheduler_finds_a_budget_percentage_publishes_it_and_delivers_it(stack: Stack) -> None:
    rule = stack.rule(
        "acme:write",
        url=stack.receiver.answer("/budget"),
        events=["budget.nearly_spent"],
        budget_percent=75,
    )
    capped = stack.call(
        "acme:admin", "PUT", "/v1/fine_tuning/budget", json={"monthly_cost_cap": 20}
    )
    assert capped.status_code == 200, capped.text
    engine = db.make_engine(stack.settings.database_url)
    now = utcnow()
    try:
        with session_scope(engine) as session:  # a job that ran 48 minutes at 20 USD an hour
            session.add(
                JobRow(
                    id="ftjob-spent",
                    tenant="acme",
                    status="succeeded",
                    model="m",
                    training_file="file-1",
                    request=b"{}",
                )
            )
            session.add(
                AttemptRow(
                    id="spent-a1",
                    job_id="ftjob-spent",
                    number=1,
                    provider="local",
                    ref="1:1",
                    work_dir="/tmp/x",
                    state="exited",
                    cost_per_hour=20.0,
                    device_count=1,
                    started_at=now - timedelta(minutes=48),
                    ended_at=now,
                )
            )
    finally:
        engine.dispose()

    (request,) = stack.receiver.wait_for("/budget", 1)
    verify(rule["secret"], request.headers, request.body)
    body = request.json()
    assert (body["type"], body["data"]["percent"], body["data"]["cap"]) == (
        "budget.nearly_spent",
        75,
        20.0,
    )
    assert body["data"]["spent"] == pytest.approx(16.0, abs=0.1)
    metrics = httpx.get(f"http://127.0.0.1:{stack.settings.services.scheduler_port}/metrics").text
    assert "tuneloop_training_budget_spent_ratio{" in metrics


def test_a_scheduler_killed_mid_retry_delivers_after_its_restart(stack: Stack) -> None:
    rule = stack.rule(
        "acme:write", url=stack.receiver.answer("/outage", *[503] * 1000), events=["job.failed"]
    )
    _publish(
        stack.settings, JobFailed(tenant="acme", job_id="ftjob-k", reason="error", message="x")
    )
    stack.until(rule["id"], lambda d: d and len(d[0]["attempts"]) >= 2)
    stack.scheduler.kill()
    stack.receiver.answer("/outage")  # the receiver is back
    stack.scheduler.start(timeout_s=90)

    (delivered,) = stack.until(rule["id"], lambda d: d and d[0]["status"] == "delivered")
    codes = [a["status_code"] for a in delivered["attempts"]]
    assert codes[-1] == 200
    assert set(codes[:-1]) == {503}
    assert {r.headers["webhook-id"] for r in stack.receiver.at("/outage")} == {delivered["id"]}


def test_a_rules_test_notification_is_signed_sent_through_the_outbox_and_answered(
    stack: Stack,
) -> None:
    # Disabled, and its receiver fails the first try: the test is sent all the same, retried.
    rule = stack.rule(
        "acme:write",
        url=stack.receiver.answer("/ping", 503),
        events=["job.failed"],
        enabled=False,
    )
    path = f"{RULES}/{rule['id']}/test"
    answer = stack.call("acme:write", "POST", path)
    assert answer.status_code == 200, answer.text
    delivery = answer.json()
    assert (delivery["object"], delivery["event"], delivery["rule_id"]) == (
        "notification_rule.delivery",
        "test",
        rule["id"],
    )
    assert (delivery["status"], delivery["last_status_code"]) == ("pending", 503)
    assert [(a["number"], a["outcome"]) for a in delivery["attempts"]] == [(1, "retry")]

    first, second = stack.receiver.wait_for("/ping", 2)
    for request in (first, second):
        verify(rule["secret"], request.headers, request.body)
        assert request.headers["webhook-id"] == delivery["id"]
    body = second.json()
    assert (body["type"], body["tenant"], body["rule"]["id"]) == ("test", "acme", rule["id"])
    (delivered,) = stack.until(rule["id"], lambda d: d and d[0]["status"] == "delivered")
    assert delivered["id"] == delivery["id"]

    again = stack.call("acme:write", "POST", path).json()  # each call a delivery of its own
    assert again["id"] != delivery["id"]
    assert (again["status"], again["attempts"][0]["status_code"]) == ("delivered", 200)
    assert stack.call("acme:read", "POST", path).status_code == 403
    other = stack.call("globex:write", "POST", path)
    assert other.status_code == 404, other.text
    assert rule["id"] in other.json()["error"]["message"]
    missing = stack.call("acme:write", "POST", f"{RULES}/nr_missing/test")
    assert (missing.status_code, missing.json()["error"]["param"]) == (404, "rule_id")

"""Notification rules as plain functions: which facts are alerts and which rules they reach,
the bodies (ours and Slack's), the signatures (checked by an independent implementation of
Standard Webhooks), where a URL may point, and when a delivery is retried or given up.
The delivery itself, on a real database and a real receiver: test_notification_delivery.py."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from services.scheduler.config import NotificationSettings
from services.scheduler.notifications import bodies, signing
from services.scheduler.notifications.delivery import Answer, backoff_s, outcome, retry_after
from services.scheduler.notifications.matching import Alert, alert_of, matches, stuck
from services.scheduler.notifications.rules import RuleError, check_url
from services.scheduler.notifications.schemas import RuleCreate
from shared.events import (
    CanaryFailed,
    CaptureSpilled,
    DeploymentFailed,
    DeploymentRolledBack,
    EvalDecided,
    JobFailed,
    TrainingBudgetThresholdReached,
)
from tests.fakes.webhook_receiver import verify

NOW = datetime(2026, 12, 7, 10, 0, tzinfo=UTC)
URL = "https://hooks.example.com/tuneloop"


def _decided(gate: str | None) -> EvalDecided:
    return EvalDecided(
        tenant="acme",
        job_id="ftjob-1",
        base_model="SmolLM2-135M-Instruct",
        fine_tuned_model="ft:SmolLM2-135M-Instruct:billing:ftjob-1",
        dataset_id="ds-1",
        dataset_version="v1",
        best_step=40,
        best_checkpoint_uri="s3://b/ckpt-40",
        best_score=0.41,
        base_score=0.55,
        gate=gate,
        gate_reason="0.410 does not beat the base's 0.550",
    )


def _budget(percent: int) -> TrainingBudgetThresholdReached:
    return TrainingBudgetThresholdReached(
        tenant="acme",
        percent=percent,
        spent=8.5,
        cap=10.0,
        period_start=datetime(2026, 12, 1, tzinfo=UTC),
        resets_at=datetime(2027, 1, 1, tzinfo=UTC),
    )


def _spilled(tenant: str = "acme", refused: int = 0) -> CaptureSpilled:
    return CaptureSpilled(
        tenant=tenant,
        started_at=NOW - timedelta(minutes=7),
        ended_at=NOW,
        samples=120,
        bytes=480_000,
        refused=refused,
        max_backlog_fraction=0.42,
    )


def _broken(deployment_id: str, *, served_name: str | None) -> DeploymentFailed:
    return DeploymentFailed(
        tenant="acme",
        deployment_id=deployment_id,
        served_model_name="ft:base:billing-desk:ftjob-9",
        served_name=served_name,
        reason="oom",
    )


def _rule(**parts: object) -> RuleCreate:
    return RuleCreate.model_validate({"name": "on-call", "url": URL} | parts)


def test_each_source_fact_becomes_its_alert_with_what_filters_read() -> None:
    failed = alert_of(
        JobFailed(tenant="acme", job_id="ftjob-1", reason="nan_loss", message="loss became NaN"),
        suffix="billing",
    )
    assert failed is not None
    assert (failed.event, failed.suffix, failed.title) == (
        "job.failed",
        "billing",
        "Job ftjob-1 failed (nan_loss)",
    )
    assert dict(failed.facts)["Reason"] == "nan_loss"
    assert failed.data["message"] == "loss became NaN"

    assert alert_of(_decided("passed")) is None
    assert alert_of(_decided(None)) is None
    gate = alert_of(_decided("rejected"), suffix="billing")
    assert gate is not None
    assert gate.event == "eval.gate_failed"
    assert gate.text == "0.410 does not beat the base's 0.550"

    rolled = alert_of(
        DeploymentRolledBack(
            tenant="acme",
            deployment_id="dep-2",
            name="billing-desk",
            reason="error_rate",
            requests=60,
            errors=9,
        )
    )
    assert rolled is not None
    assert (rolled.event, rolled.served_name) == ("deployment.rolled_back", "billing-desk")
    assert dict(rolled.facts)["Errors"] == "9"
    canary = alert_of(
        CanaryFailed(
            tenant="acme",
            name="billing-desk",
            revision=3,
            deployment_id="dep-2",
            requests=60,
            errors=9,
            reason="5xx",
        )
    )
    assert canary is not None
    assert canary.event == "deployment.unhealthy"
    broken = alert_of(_broken("dep-3", served_name="billing-desk"))
    assert broken is not None
    assert (broken.event, broken.served_name) == ("deployment.unhealthy", "billing-desk")
    assert broken.title == "Deployment dep-3 of ft:base:billing-desk:ftjob-9 failed"
    assert dict(broken.facts)["Served name"] == "billing-desk"
    alone = alert_of(_broken("dep-4", served_name=None))
    assert alone is not None
    assert alone.served_name is None
    assert "Served name" not in dict(alone.facts)
    budget = alert_of(_budget(80))
    assert budget is not None
    assert (budget.event, budget.budget_percent) == ("budget.nearly_spent", 80)
    assert "8.50 of 10.00 USD" in budget.text


def test_rules_take_their_events_their_filter_and_their_threshold() -> None:
    failed = alert_of(
        JobFailed(tenant="acme", job_id="ftjob-1", reason="oom", message="x"), suffix="billing"
    )
    assert failed is not None
    assert matches(_rule(events=["job.failed"]), failed)
    assert not matches(_rule(events=["eval.gate_failed"]), failed)
    assert not matches(_rule(events=["job.failed"], enabled=False), failed)
    assert matches(_rule(events=["job.failed"], filter={"suffix": "billing"}), failed)
    assert not matches(_rule(events=["job.failed"], filter={"suffix": "support"}), failed)

    rolled = alert_of(
        DeploymentRolledBack(tenant="acme", deployment_id="d", name="billing-desk", reason="r")
    )
    assert rolled is not None
    desk = _rule(
        events=["deployment.rolled_back", "deployment.unhealthy"],
        filter={"served_name": "billing-desk"},
    )
    other = _rule(
        events=["deployment.rolled_back", "deployment.unhealthy"], filter={"served_name": "support"}
    )
    assert matches(desk, rolled)
    assert not matches(other, rolled)
    # deployment.failed names the served name its deployment was under: the filter applies,
    # and a deployment under none (its own ft: name) reaches unfiltered rules only.
    for served_name, reaches in [
        ("billing-desk", (True, False, True)),
        ("support", (False, True, True)),
        (None, (False, False, True)),
    ]:
        broken = alert_of(_broken("d", served_name=served_name))
        assert broken is not None
        everything = _rule(events=["deployment.unhealthy"])
        assert (matches(desk, broken), matches(other, broken), matches(everything, broken)) == (
            reaches
        ), served_name
    # A suffix filter does not hold back the deployment facts of the same rule.
    mixed = _rule(events=["job.failed", "deployment.rolled_back"], filter={"suffix": "support"})
    assert matches(mixed, rolled)
    assert not matches(mixed, failed)

    eighty = alert_of(_budget(80))
    assert eighty is not None
    assert matches(_rule(events=["budget.nearly_spent"]), eighty)  # the default is 80 %
    assert not matches(_rule(events=["budget.nearly_spent"], budget_percent=90), eighty)

    def silence(minutes: int) -> Alert:
        return stuck(
            tenant="acme",
            job_id="ftjob-1",
            suffix=None,
            attempt_id="a",
            provider="local",
            step=12,
            last_progress=NOW - timedelta(minutes=minutes),
            now=NOW,
        )

    assert matches(_rule(events=["job.stuck"]), silence(31))
    assert not matches(_rule(events=["job.stuck"]), silence(29))
    assert matches(_rule(events=["job.stuck"], stuck_after_minutes=5), silence(6))


def test_a_stuck_alert_is_once_per_silence() -> None:
    def at(last: datetime, now: datetime) -> str:
        return stuck(
            tenant="acme",
            job_id="j",
            suffix=None,
            attempt_id="a",
            provider="local",
            step=None,
            last_progress=last,
            now=now,
        ).key

    last = NOW - timedelta(minutes=40)
    assert at(last, NOW) == at(last, NOW + timedelta(minutes=5))  # the same silence: one key
    assert at(last, NOW) != at(NOW - timedelta(minutes=2), NOW)  # it reported, then went quiet


@pytest.mark.parametrize(
    ("parts", "field"),
    [
        ({"events": ["job.failed"], "stuck_after_minutes": 10}, "stuck_after_minutes"),
        ({"events": ["job.failed"], "budget_percent": 90}, "budget_percent"),
        ({"events": ["job.failed", "job.failed"]}, "events"),
        ({"events": ["budget.nearly_spent"], "filter": {"suffix": "x"}}, "filter.suffix"),
        ({"events": ["job.failed"], "filter": {"served_name": "x"}}, "filter.served_name"),
    ],
)
def test_parts_that_do_not_fit_together_name_their_field(
    parts: dict[str, object], field: str
) -> None:
    problem = _rule(**parts).incoherence()
    assert problem is not None
    assert problem[0] == field


def test_where_a_rule_may_send() -> None:
    check_url("http://127.0.0.1:9000/hook", allow_http=True)  # development: anything local
    check_url(URL, allow_http=False)
    for url, allow_http, says in [
        ("ftp://hooks.example.com/x", True, "http:// or https://"),
        ("https:///no-host", True, "with a host"),
        ("https://user:pw@hooks.example.com/x", True, "credentials"),
        ("http://hooks.example.com/x", False, "https:// only"),
        ("https://127.0.0.1/x", False, "loopback, private"),
        ("https://10.1.2.3/x", False, "loopback, private"),
        ("https://[::1]/x", False, "loopback, private"),
        ("https://169.254.169.254/latest", False, "loopback, private"),
        ("https://localhost:8401/internal", False, "loopback, private"),
    ]:
        with pytest.raises(RuleError, match=says) as refused:
            check_url(url, allow_http=allow_http)
        assert (refused.value.status, refused.value.param) == (422, "url")


def test_our_body_and_slacks() -> None:
    alert = alert_of(
        JobFailed(tenant="acme", job_id="ftjob-1", reason="error", message="<script> & co"),
        suffix="billing",
    )
    assert alert is not None
    ours = json.loads(
        bodies.render("json", alert, message_id="msg_1", rule_id="nr_1", rule_name="on-call")
    )
    assert ours["type"] == "job.failed"
    assert ours["id"] == "msg_1"
    assert ours["tenant"] == "acme"
    assert ours["rule"] == {"id": "nr_1", "name": "on-call"}
    assert ours["data"]["job_id"] == "ftjob-1"
    assert ours["facts"]["Suffix"] == "billing"
    assert datetime.fromisoformat(ours["timestamp"]) == alert.occurred_at

    slack = json.loads(
        bodies.render("slack", alert, message_id="msg_1", rule_id="nr_1", rule_name="on-call")
    )
    assert set(slack) == {"text", "blocks"}
    assert slack["text"].startswith("Job ftjob-1 failed (error)")
    header, section, context = slack["blocks"]
    assert header == {
        "type": "header",
        "text": {"type": "plain_text", "text": "Job ftjob-1 failed (error)"},
    }
    assert section["type"] == "section"
    assert section["text"]["type"] == "mrkdwn"
    # Slack's control characters escaped as its docs ask.
    assert section["text"]["text"] == "&lt;script&gt; &amp; co"
    assert {"type": "mrkdwn", "text": "*Job*\nftjob-1"} in section["fields"]
    assert context["type"] == "context"
    assert "rule on-call" in context["elements"][0]["text"]


def test_slack_limits_are_kept() -> None:
    alert = alert_of(
        DeploymentFailed(
            tenant="acme",
            deployment_id="d" * 400,
            served_model_name="m" * 256,
            served_name="s" * 256,
            reason="r" * 5000,
        )
    )
    assert alert is not None
    header, section, _ = bodies.slack(alert, rule_name="x")["blocks"]
    assert len(header["text"]["text"]) <= 150
    assert len(section["text"]["text"]) <= 3000
    assert all(len(f["text"]) <= 2000 for f in section["fields"])


def test_signatures_verify_independently_and_break_on_any_change() -> None:
    key = signing.rule_key("server-secret", "nr_1", 1)
    secret = signing.secret_text(key)
    body = b'{"type":"job.failed"}'
    headers = signing.headers(key, "msg_1", body)
    verify(secret, headers, body)
    for tampered in (
        (secret, headers, body + b" "),
        (secret, headers | {"webhook-id": "msg_2"}, body),
        (secret, headers | {"webhook-timestamp": str(int(headers["webhook-timestamp"]) + 1)}, body),
        (signing.secret_text(signing.rule_key("server-secret", "nr_1", 2)), headers, body),
        (signing.secret_text(signing.rule_key("server-secret", "nr_2", 1)), headers, body),
    ):
        with pytest.raises(AssertionError):
            verify(*tampered)
    stale = signing.headers(key, "msg_1", body, timestamp=int(NOW.timestamp()) - 3600)
    with pytest.raises(AssertionError, match="tolerance"):
        verify(secret, stale, body)


def test_what_is_retried_and_when() -> None:
    settings = NotificationSettings(backoff_s=10, max_backoff_s=60, max_attempts=5)

    def answer(code: int | None, wait: float | None = None) -> Answer:
        return Answer(code, None if code == 200 else "x", wait, 1.0)

    assert outcome(answer(204), attempt=1, max_attempts=5) == "delivered"
    for retried in (None, 408, 429, 500, 503):
        assert outcome(answer(retried), attempt=1, max_attempts=5) == "retry"
        assert outcome(answer(retried), attempt=5, max_attempts=5) == "failed"  # given up
    for final in (301, 400, 401, 404, 410, 422):
        assert outcome(answer(final), attempt=1, max_attempts=5) == "failed"

    waits = [backoff_s(answer(503), attempt=n, settings=settings) for n in range(1, 6)]
    assert waits == [10, 20, 40, 60, 60]
    assert 9 <= backoff_s(answer(503), attempt=1, settings=settings, jitter=-1) < 10
    assert backoff_s(answer(429, 30), attempt=1, settings=settings) == 30  # Retry-After wins
    assert backoff_s(answer(429, 9999), attempt=1, settings=settings) == 60  # within the bound

    assert retry_after("120", NOW) == 120
    assert retry_after("Mon, 07 Dec 2026 10:01:30 GMT", NOW) == 90
    assert retry_after("soon", NOW) is None
    assert retry_after(None, NOW) is None


def test_a_spill_episode_is_an_alert_for_the_tenants_whose_samples_waited() -> None:
    alert = alert_of(_spilled())
    assert alert is not None
    assert (alert.event, alert.tenant, alert.title) == (
        "capture.spilling",
        "acme",
        "Capture held 120 of your samples back for 7 min",
    )
    assert dict(alert.facts) == {
        "Samples delayed": "120",
        "Samples lost": "0",
        "Lasted": "7 min",
        "Spill file at most": "42% full",
    }
    assert "None were lost" in alert.text
    assert alert.data["max_backlog_fraction"] == 0.42
    lost = alert_of(_spilled(refused=3))
    assert lost is not None
    assert "3 were refused at the spill file's cap" in lost.text

    assert matches(_rule(events=["capture.spilling"]), alert)
    assert not matches(_rule(events=["job.failed"]), alert)
    # Neither filter applies to it: a rule's served-name filter holds back other facts only.
    mixed = _rule(
        events=["deployment.unhealthy", "capture.spilling"], filter={"served_name": "support"}
    )
    assert matches(mixed, alert)
    assert _rule(events=["capture.spilling"]).incoherence() is None
    only = _rule(events=["capture.spilling"], filter={"suffix": "x"}).incoherence()
    assert only is not None
    assert only[0] == "filter.suffix"

    body = json.loads(
        bodies.render("json", alert, message_id="msg_1", rule_id="nr_1", rule_name="on-call")
    )
    assert (body["type"], body["data"]["samples"]) == ("capture.spilling", 120)

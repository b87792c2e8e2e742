"""Which facts are alerts, and which rules they reach: a bus event (or a check's finding)
becomes an `Alert` with its words and its data; `matches` says whether a rule wants it.

    job.failed              job.failed
    job.stuck               a running job with no report for the rule's minutes (checks.py)
    eval.gate_failed        eval.decided whose gate rejected the checkpoint
    deployment.rolled_back  deployment.rolled_back
    deployment.unhealthy    deployment.failed, deployment.canary_failed
    budget.nearly_spent     job.budget_threshold_reached at the rule's percentage
    capture.spilling        capture.spilled: the tenant's samples waited in a gateway's spill
                            file (NATS or S3 away), told once they are all delivered

and `test`, which no rule names: what POST /v1/notification_rules/{id}/test sends.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from services.scheduler.notifications.schemas import (
    SERVED_NAME_EVENTS,
    SUFFIX_EVENTS,
    AlertEvent,
    RuleCreate,
)
from shared.events import (
    CanaryFailed,
    CaptureSpilled,
    DeploymentFailed,
    DeploymentRolledBack,
    EvalDecided,
    Event,
    JobFailed,
    TrainingBudgetThresholdReached,
)

# The bus events that can be alerts (the scheduler's notifier subscribes to each).
SOURCES: tuple[type[Event], ...] = (
    JobFailed,
    EvalDecided,
    DeploymentRolledBack,
    DeploymentFailed,
    CanaryFailed,
    TrainingBudgetThresholdReached,
    CaptureSpilled,
)


@dataclass(frozen=True)
class Alert:
    event: AlertEvent
    # Once per rule: the bus event's id, or the check's own key.
    key: str
    tenant: str
    occurred_at: datetime
    title: str
    text: str
    # (label, value) pairs a person reads first; `data` is the whole fact, for programs.
    facts: tuple[tuple[str, str], ...]
    data: dict[str, Any] = field(default_factory=dict)
    suffix: str | None = None
    served_name: str | None = None
    budget_percent: int | None = None
    idle_s: float | None = None


def alert_of(event: Event, *, suffix: str | None = None) -> Alert | None:
    """The alert a bus event is, or None (an eval decision that passed its gate, say).
    `suffix`: the job's, for job facts (the scheduler's own table knows it)."""
    common: dict[str, Any] = {
        "key": event.event_id,
        "tenant": event.tenant,
        "occurred_at": event.occurred_at,
        "data": event.model_dump(mode="json"),
    }
    if isinstance(event, JobFailed):
        return Alert(
            event="job.failed",
            title=f"Job {event.job_id} failed ({event.reason})",
            text=_short(event.message),
            facts=_facts(
                ("Job", event.job_id),
                ("Suffix", suffix),
                ("Reason", event.reason),
                ("Last checkpoint", event.last_checkpoint_uri),
            ),
            suffix=suffix,
            **common,
        )
    if isinstance(event, EvalDecided):
        return _gate_failed(event, suffix, common)
    if isinstance(event, DeploymentRolledBack):
        return Alert(
            event="deployment.rolled_back",
            title=f"{event.name} rolled back",
            text=_short(event.reason),
            facts=_facts(
                ("Served name", event.name),
                ("Taken out", event.deployment_id),
                ("Restored", event.restored_deployment_id),
                *_traffic(event),
            ),
            served_name=event.name,
            **common,
        )
    if isinstance(event, CanaryFailed):
        return Alert(
            event="deployment.unhealthy",
            title=f"The canary of {event.name} crossed its rollback policy",
            text=_short(event.reason),
            facts=_facts(
                ("Served name", event.name), ("Deployment", event.deployment_id), *_traffic(event)
            ),
            served_name=event.name,
            **common,
        )
    if isinstance(event, DeploymentFailed):
        return Alert(
            event="deployment.unhealthy",
            title=f"Deployment {event.deployment_id} of {event.served_model_name} failed",
            text=_short(event.reason),
            facts=_facts(
                ("Served name", event.served_name),
                ("Model", event.served_model_name),
                ("Deployment", event.deployment_id),
            ),
            served_name=event.served_name,
            **common,
        )
    if isinstance(event, TrainingBudgetThresholdReached):
        return Alert(
            event="budget.nearly_spent",
            title=f"{event.percent} % of this month's training budget is spent",
            text=f"{event.spent:.2f} of {event.cap:.2f} USD since {event.period_start:%Y-%m-%d} "
            f"(UTC); new jobs are refused at the cap until {event.resets_at:%Y-%m-%d}.",
            facts=_facts(("Spent", f"{event.spent:.2f} USD"), ("Cap", f"{event.cap:.2f} USD")),
            budget_percent=event.percent,
            **common,
        )
    if isinstance(event, CaptureSpilled):
        return _spilled(event, common)
    return None


def _spilled(event: CaptureSpilled, common: dict[str, Any]) -> Alert:
    lasted = _duration((event.ended_at - event.started_at).total_seconds())
    lost = (
        f" {event.refused} were refused at the spill file's cap: they are not in your samples."
        if event.refused
        else " None were lost."
    )
    return Alert(
        event="capture.spilling",
        title=f"Capture held {event.samples} of your samples back for {lasted}",
        text=f"NATS or object storage was away from {event.started_at:%Y-%m-%d %H:%M:%S} to "
        f"{event.ended_at:%H:%M:%S} UTC; the gateway kept answering calls and kept their "
        f"samples on disk, all delivered since.{lost}",
        facts=_facts(
            ("Samples delayed", str(event.samples)),
            ("Samples lost", str(event.refused)),
            ("Lasted", lasted),
            ("Spill file at most", f"{event.max_backlog_fraction:.0%} full"),
        ),
        **common,
    )


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _gate_failed(event: EvalDecided, suffix: str | None, common: dict[str, Any]) -> Alert | None:
    if event.gate != "rejected":
        return None
    return Alert(
        event="eval.gate_failed",
        title=f"The eval gate rejected {event.fine_tuned_model}",
        text=_short(event.gate_reason or "the best checkpoint did not beat the bar"),
        facts=_facts(
            ("Job", event.job_id),
            ("Suffix", suffix),
            ("Best score", _score(event.best_score)),
            ("Base score", _score(event.base_score)),
            ("Best step", str(event.best_step)),
        ),
        suffix=suffix,
        **common,
    )


def stuck(
    *,
    tenant: str,
    job_id: str,
    suffix: str | None,
    attempt_id: str,
    provider: str,
    step: int | None,
    last_progress: datetime,
    now: datetime,
) -> Alert:
    """A running job not heard from since `last_progress`; once per silence (a report and a
    new silence is a new alert)."""
    idle = (now - last_progress).total_seconds()
    return Alert(
        event="job.stuck",
        key=f"job.stuck:{job_id}:{int(last_progress.timestamp())}",
        tenant=tenant,
        occurred_at=now,
        title=f"Job {job_id} has made no progress for {idle / 60:.0f} min",
        text=f"Its trainer on {provider} last reported at {last_progress:%Y-%m-%d %H:%M:%S} UTC"
        + (f", at step {step}." if step is not None else ", before its first step."),
        facts=_facts(
            ("Job", job_id),
            ("Suffix", suffix),
            ("Provider", provider),
            ("Last step", None if step is None else str(step)),
        ),
        data={
            "job_id": job_id,
            "attempt_id": attempt_id,
            "provider": provider,
            "step": step,
            "last_progress_at": last_progress.isoformat(),
            "idle_s": round(idle, 1),
        },
        suffix=suffix,
        idle_s=idle,
    )


def probe(*, tenant: str, rule_id: str, rule_name: str, now: datetime) -> Alert:
    """What POST /v1/notification_rules/{id}/test sends: a delivery of its own each time."""
    return Alert(
        event="test",
        key=f"test:{uuid.uuid4().hex}",
        tenant=tenant,
        occurred_at=now,
        title=f"Test notification for rule {rule_name}",
        text="This rule's URL received a signed tuneloop notification: it is set up.",
        facts=_facts(("Rule", rule_name)),
        data={"rule_id": rule_id},
    )


def matches(rule: RuleCreate, alert: Alert) -> bool:
    if not rule.enabled or alert.event not in rule.events:
        return False
    if alert.event == "budget.nearly_spent" and alert.budget_percent != rule.budget_threshold():
        return False
    if alert.event == "job.stuck" and (alert.idle_s or 0.0) < rule.stuck_minutes() * 60:
        return False
    wanted = rule.filter
    if wanted is None:
        return True
    if wanted.suffix is not None and alert.event in SUFFIX_EVENTS and alert.suffix != wanted.suffix:
        return False
    # A deployment under no served name (its own ft: name only) is not the filter's name.
    return not (
        wanted.served_name is not None
        and alert.event in SERVED_NAME_EVENTS
        and alert.served_name != wanted.served_name
    )


def _traffic(event: DeploymentRolledBack | CanaryFailed) -> list[tuple[str, str | None]]:
    p95 = None if event.p95_ms is None else f"{event.p95_ms:.0f} ms"
    requests = None if event.requests is None else str(event.requests)
    errors = None if event.errors is None else str(event.errors)
    return [("Requests", requests), ("Errors", errors), ("p95", p95)]


def _facts(*pairs: tuple[str, str | None]) -> tuple[tuple[str, str], ...]:
    return tuple((label, value) for label, value in pairs if value)


def _score(value: float | None) -> str | None:
    return None if value is None else f"{value:.3f}"


def _short(text: str, limit: int = 500) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"

"""The notification rules API's request and response shapes.

A rule names the facts it fires on (`RuleEvent`), an optional filter, the URL that receives
them and the body's format: `json` (ours, below) or `slack` (an incoming webhook's
`{"text", "blocks"}`). Thresholds belong to the facts that have one: `stuck_after_minutes`
to `job.stuck`, `budget_percent` to `budget.nearly_spent`.
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

RuleEvent = Literal[
    "job.failed",
    "job.stuck",
    "eval.gate_failed",
    "deployment.rolled_back",
    "deployment.unhealthy",
    "budget.nearly_spent",
    "capture.spilling",
]
# What a delivery is about: a rule event, or `test` (POST /v1/notification_rules/{id}/test).
AlertEvent = Literal[RuleEvent, "test"]
Format = Literal["json", "slack"]
DeliveryStatus = Literal["pending", "delivered", "failed"]
# The facts each filter can be checked against; a filter passes facts that do not carry it.
SUFFIX_EVENTS: frozenset[str] = frozenset({"job.failed", "job.stuck", "eval.gate_failed"})
SERVED_NAME_EVENTS: frozenset[str] = frozenset({"deployment.rolled_back", "deployment.unhealthy"})
DEFAULT_STUCK_MINUTES = 30
DEFAULT_BUDGET_PERCENT = 80
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9 ._-]*$"


class RuleFilter(BaseModel):
    model_config = ConfigDict(extra="forbid")

    suffix: str | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        description="only jobs with this suffix (job.failed, job.stuck, eval.gate_failed)",
    )
    served_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="only this served name (deployment.rolled_back, deployment.unhealthy: "
        "a deployment under no served name does not pass)",
    )


class RuleCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=64, pattern=NAME_PATTERN)
    events: list[RuleEvent] = Field(min_length=1, max_length=len(get_args(RuleEvent)))
    url: str = Field(
        min_length=1,
        max_length=2048,
        description="https:// (http:// only outside production); redirects are not followed",
    )
    format: Format = "json"
    filter: RuleFilter | None = None
    stuck_after_minutes: int | None = Field(
        default=None,
        ge=1,
        le=7 * 24 * 60,
        description=f"job.stuck: minutes without a report (default {DEFAULT_STUCK_MINUTES})",
    )
    budget_percent: int | None = Field(
        default=None,
        ge=1,
        le=100,
        description="budget.nearly_spent: the percentage of the month's cap (default "
        f"{DEFAULT_BUDGET_PERCENT})",
    )
    enabled: bool = True

    def incoherence(self) -> tuple[str, str] | None:
        """(field, why) when the parts do not fit together, else None."""
        given = set(self.events)
        if len(given) != len(self.events):
            return "events", "each event once"
        if self.stuck_after_minutes is not None and "job.stuck" not in given:
            return "stuck_after_minutes", "only with the event job.stuck"
        if self.budget_percent is not None and "budget.nearly_spent" not in given:
            return "budget_percent", "only with the event budget.nearly_spent"
        if self.filter is not None and self.filter.suffix and not given & SUFFIX_EVENTS:
            return "filter.suffix", f"applies only to {', '.join(sorted(SUFFIX_EVENTS))}"
        if self.filter is not None and self.filter.served_name and not given & SERVED_NAME_EVENTS:
            return "filter.served_name", f"applies only to {', '.join(sorted(SERVED_NAME_EVENTS))}"
        return None

    def stuck_minutes(self) -> int:
        return self.stuck_after_minutes or DEFAULT_STUCK_MINUTES

    def budget_threshold(self) -> int:
        return self.budget_percent or DEFAULT_BUDGET_PERCENT


class RuleUpdate(BaseModel):
    """Fields given replace the rule's; the result is checked as a new rule would be.
    `rotate_secret`: a new signing secret, returned in this answer only."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(default=None, min_length=1, max_length=64, pattern=NAME_PATTERN)
    events: list[RuleEvent] | None = Field(
        default=None, min_length=1, max_length=len(get_args(RuleEvent))
    )
    url: str | None = Field(default=None, min_length=1, max_length=2048)
    format: Format | None = None
    filter: RuleFilter | None = None
    stuck_after_minutes: int | None = Field(default=None, ge=1, le=7 * 24 * 60)
    budget_percent: int | None = Field(default=None, ge=1, le=100)
    enabled: bool | None = None
    rotate_secret: bool = False


class Rule(BaseModel):
    object: Literal["notification_rule"] = "notification_rule"
    id: str
    name: str
    enabled: bool
    events: list[RuleEvent]
    url: str
    format: Format
    filter: RuleFilter | None = None
    stuck_after_minutes: int | None = None
    budget_percent: int | None = None
    created_at: int
    updated_at: int
    secret: str | None = Field(
        default=None,
        description="whsec_...: the signing secret, in the answer to create and to a PATCH "
        "with rotate_secret only; never shown again",
    )


class RuleList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Rule]


class RuleDeleted(BaseModel):
    id: str
    object: Literal["notification_rule.deleted"] = "notification_rule.deleted"
    deleted: bool = True


class DeliveryAttempt(BaseModel):
    number: int
    started_at: int
    duration_ms: float
    status_code: int | None = Field(description="null: no answer (connection error, timeout)")
    error: str | None = None
    outcome: Literal["delivered", "retry", "failed"]


class Delivery(BaseModel):
    object: Literal["notification_rule.delivery"] = "notification_rule.delivery"
    id: str = Field(description="the webhook-id header: the same on every attempt")
    rule_id: str
    event: AlertEvent
    status: DeliveryStatus
    created_at: int
    delivered_at: int | None = None
    next_attempt_at: int | None = Field(default=None, description="pending: the next try")
    last_status_code: int | None = None
    last_error: str | None = None
    attempts: list[DeliveryAttempt]


class DeliveryList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Delivery]
    has_more: bool

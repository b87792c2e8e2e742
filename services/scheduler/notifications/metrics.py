"""What the notifier exports on the scheduler's /metrics, for deploy/prometheus/alerts.yml:

    tuneloop_alerts_total{event}                          alertable facts seen on the bus
                                                          (matching.py's names: job.failed,
                                                          eval.gate_failed, ...)
    tuneloop_job_last_progress_timestamp_seconds{tenant, job_id}
                                                          each running job's last report (Unix s)
    tuneloop_training_budget_spent_ratio{tenant}          this month's spend / the cap that applies
    tuneloop_notification_deliveries_total{outcome}       attempts: delivered, retry, failed

The counters' series exist from start (at 0), so Prometheus' increase() sees the first fact
too: a series born at 1 would hide it. For that the facts are counted without their tenant
(the notifier logs each with it). The gauges are what the last check saw (checks.py, every TUNELOOP_SCHEDULER_NOTIFY_CHECK_INTERVAL_S);
a job that stopped running, or a tenant without a cap, has no series.
"""

from __future__ import annotations

from collections.abc import Iterable

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

_meter = metrics.get_meter("tuneloop.scheduler.notifications")

ALERTS = _meter.create_counter(
    "tuneloop.alerts", description="Alertable facts the scheduler's notifier saw, by event."
)
DELIVERIES = _meter.create_counter(
    "tuneloop.notification.deliveries",
    description="Notification delivery attempts, by outcome (delivered, retry, failed).",
)

# What the counters are counted by: every series made at start (see prime).
ALERT_EVENTS = (
    "job.failed",
    "eval.gate_failed",
    "deployment.rolled_back",
    "deployment.unhealthy",
    "budget.nearly_spent",
    "capture.spilling",
)
OUTCOMES = ("delivered", "retry", "failed")

_progress: dict[tuple[str, str], float] = {}
_budget: dict[str, float] = {}


def prime() -> None:
    """Every counter series at 0, once the process's meter provider is set (ServiceRuntime)."""
    for event in ALERT_EVENTS:
        ALERTS.add(0, {"event": event})
    for outcome in OUTCOMES:
        DELIVERIES.add(0, {"outcome": outcome})


def set_progress(seen: dict[tuple[str, str], float]) -> None:
    """(tenant, job id) -> last report, Unix seconds: every running job, replacing the last."""
    _progress.clear()
    _progress.update(seen)


def set_budget(seen: dict[str, float]) -> None:
    """tenant -> spent / cap, for every tenant with a cap this month, replacing the last."""
    _budget.clear()
    _budget.update(seen)


def _observe_progress(options: CallbackOptions) -> Iterable[Observation]:
    return [Observation(t, {"tenant": k[0], "job_id": k[1]}) for k, t in list(_progress.items())]


def _observe_budget(options: CallbackOptions) -> Iterable[Observation]:
    return [Observation(ratio, {"tenant": tenant}) for tenant, ratio in list(_budget.items())]


_meter.create_observable_gauge(
    "tuneloop.job.last_progress.timestamp_seconds",
    callbacks=[_observe_progress],
    description="Each running fine-tuning job's last trainer report, Unix seconds.",
)
_meter.create_observable_gauge(
    "tuneloop.training_budget.spent_ratio",
    callbacks=[_observe_budget],
    description="This month's training spend over the monthly cap that applies, per tenant.",
)

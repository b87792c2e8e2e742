"""The facts no event says, found by looking: a running job whose trainer stopped reporting
(`job.stuck`, per rule: its own minutes), and a tenant's month's training spend reaching a
percentage of its cap, which the scheduler publishes as `job.budget_threshold_reached`, once
per percentage and month (50, 80, 100, and each percentage a rule of the tenant names).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel import Session, col, select

from services.scheduler import budgets
from services.scheduler.ladder import ProviderPool
from services.scheduler.models import AttemptRow, BudgetThresholdRow, JobRow, TenantBudgetRow
from services.scheduler.notifications.matching import Alert, stuck
from shared.events import TrainingBudgetThresholdReached

BUDGET_PERCENTS = frozenset({50, 80, 100})


@dataclass(frozen=True)
class Silence:
    """A running job and its current attempt's last report (its start, before any)."""

    job: JobRow
    attempt: AttemptRow

    @property
    def last_progress(self) -> datetime:
        return self.attempt.last_report_at or self.attempt.started_at


def silences(session: Session) -> list[Silence]:
    """Every running job with its current (highest-numbered) attempt."""
    jobs = {job.id: job for job in session.exec(select(JobRow).where(JobRow.status == "running"))}
    if not jobs:
        return []
    current: dict[str, AttemptRow] = {}
    attempts = session.exec(select(AttemptRow).where(col(AttemptRow.job_id).in_(list(jobs))))
    for attempt in attempts:
        if attempt.job_id not in current or attempt.number > current[attempt.job_id].number:
            current[attempt.job_id] = attempt
    return [Silence(jobs[job_id], attempt) for job_id, attempt in current.items()]


def stuck_alerts(found: list[Silence], now: datetime) -> list[Alert]:
    """One alert per silence; each rule's minutes decide whether it is its (matching.py)."""
    return [
        stuck(
            tenant=s.job.tenant,
            job_id=s.job.id,
            suffix=s.job.suffix,
            attempt_id=s.attempt.id,
            provider=s.attempt.provider,
            step=s.attempt.last_step,
            last_progress=s.last_progress,
            now=now,
        )
        for s in found
    ]


@dataclass(frozen=True)
class BudgetCheck:
    reached: list[TrainingBudgetThresholdReached]  # not published yet
    ratios: dict[str, float]  # tenant -> spent / cap, for every tenant with a cap


def budget_check(
    session: Session,
    pool: ProviderPool,
    *,
    platform_cap: float | None,
    wanted: dict[str, set[int]],
    now: datetime,
) -> BudgetCheck:
    """Each tenant with spend this month or a cap of its own: its ratio, and the percentages
    (`BUDGET_PERCENTS` and those its rules want) reached and not yet published this month."""
    start = budgets.month_start(now)
    spenders = select(JobRow.tenant).join(AttemptRow, col(AttemptRow.job_id) == col(JobRow.id))
    tenants = set(session.exec(spenders.where(col(AttemptRow.started_at) >= start)).all())
    tenants |= set(session.exec(select(TenantBudgetRow.tenant)).all())
    reached, ratios = [], {}
    for tenant in sorted(tenants):
        state = budgets.budget(session, pool, tenant=tenant, platform_cap=platform_cap)
        cap = state.effective_monthly_cost_cap
        if cap is None or cap <= 0:
            continue
        ratios[tenant] = state.spent / cap
        done = set(
            session.exec(
                select(BudgetThresholdRow.percent)
                .where(BudgetThresholdRow.tenant == tenant)
                .where(BudgetThresholdRow.period_start == state.period_start)
            ).all()
        )
        for percent in sorted((BUDGET_PERCENTS | wanted.get(tenant, set())) - done):
            if state.spent >= cap * percent / 100:
                reached.append(
                    TrainingBudgetThresholdReached(
                        # The same id each time it is found: the stream drops a re-publication
                        # and the notifier enqueues nothing twice for it.
                        event_id=f"budget-{tenant}-{state.period_start:%Y%m}-{percent}",
                        tenant=tenant,
                        percent=percent,
                        spent=round(state.spent, 6),
                        cap=cap,
                        period_start=state.period_start,
                        resets_at=state.resets_at,
                    )
                )
    return BudgetCheck(reached, ratios)


def mark_published(session: Session, event: TrainingBudgetThresholdReached) -> None:
    """Once published, never again this month (a second check or replica inserts nothing)."""
    module = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
    table = BudgetThresholdRow.__table__  # type: ignore[attr-defined]  # SQLModel sets it
    values = BudgetThresholdRow(
        tenant=event.tenant,
        period_start=event.period_start,
        percent=event.percent,
        spent=event.spent,
        cap=event.cap,
    ).model_dump()
    session.execute(module.insert(table).values(values).on_conflict_do_nothing())
    session.commit()

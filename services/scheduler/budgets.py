"""Budgets: a job's own limits (time, cost) and a tenant's monthly cap on training cost.

A job's `max_duration_s` counts the time its attempts ran (waiting in the queue is free) and its
`max_cost` their cost at the prices they were placed at (usage.py). Reached, the scheduler stops
the run like an early stop: the trainer checkpoints, training ends there and the evaluator
chooses among what was scored, so the job still ends with its best checkpoint (attempts.py).

A tenant's monthly cap is the lower of its own (`PUT /v1/fine_tuning/budget`, an admin key) and
the platform's (`TUNELOOP_SCHEDULER_TENANT_MONTHLY_CAP`). Past it new jobs are refused with 429
and the numbers; jobs already accepted run on (stopping them would waste what they spent).
Months are calendar months in UTC.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlmodel import Session, col, select

from services.scheduler import usage
from services.scheduler.jobs import JobError
from services.scheduler.ladder import ProviderPool
from services.scheduler.models import AttemptRow, JobRow, TenantBudgetRow
from services.scheduler.protocol import Budget
from shared.db import utcnow


def month_start(now: datetime) -> datetime:
    return datetime(now.year, now.month, 1, tzinfo=UTC)


def next_month(now: datetime) -> datetime:
    year, month = (now.year + 1, 1) if now.month == 12 else (now.year, now.month + 1)
    return datetime(year, month, 1, tzinfo=UTC)


def budget(
    session: Session, pool: ProviderPool, *, tenant: str, platform_cap: float | None
) -> Budget:
    now = utcnow()
    row = session.get(TenantBudgetRow, tenant)
    own = row.monthly_cost_cap if row is not None else None
    caps = [cap for cap in (own, platform_cap) if cap is not None]
    start = month_start(now)
    spent = usage.total(usage.tenant_attempts(session, tenant, start), pool, now)
    return Budget(
        monthly_cost_cap=own,
        platform_monthly_cost_cap=platform_cap,
        effective_monthly_cost_cap=min(caps) if caps else None,
        period_start=start,
        resets_at=next_month(now),
        spent=spent.cost,
    )


def set_cap(session: Session, *, tenant: str, cap: float | None) -> None:
    row = session.get(TenantBudgetRow, tenant) or TenantBudgetRow(tenant=tenant)
    row.monthly_cost_cap, row.updated_at = cap, utcnow()
    session.add(row)
    session.commit()


def refuse_past_cap(
    session: Session, pool: ProviderPool, *, tenant: str, platform_cap: float | None
) -> None:
    """429 for a tenant that has spent its month's cap, with the numbers and when it resets."""
    state = budget(session, pool, tenant=tenant, platform_cap=platform_cap)
    cap = state.effective_monthly_cost_cap
    if cap is None or state.spent < cap:
        return
    raise JobError(
        429,
        f"monthly training budget spent: {state.spent:.2f} of {cap:.2f} USD since "
        f"{state.period_start:%Y-%m-%d} (UTC); new jobs are accepted again from "
        f"{state.resets_at:%Y-%m-%d}, or when the cap is raised",
        code="budget_exceeded",
    )


def job_limit_reached(session: Session, pool: ProviderPool, job: JobRow) -> str | None:
    """Why the job must stop now (its time or cost budget is spent), or None."""
    if job.max_duration_s is None and job.max_cost is None:
        return None
    attempts = session.exec(select(AttemptRow).where(col(AttemptRow.job_id) == job.id)).all()
    spent = usage.total(attempts, pool)
    if job.max_duration_s is not None and spent.seconds >= job.max_duration_s:
        return (
            f"its attempts have run {spent.seconds:.0f} s of max_duration_s {job.max_duration_s:g}"
        )
    if job.max_cost is not None and spent.cost >= job.max_cost:
        return f"its attempts have cost {spent.cost:.2f} of max_cost {job.max_cost:g} USD"
    return None

"""What a tenant's training used, per provider: attempts, device-hours and their cost.

An attempt's time runs from its start to its end (to now while it runs); its device-hours are
that time x the rung's device count, its cost the device-hours x the rung's `cost_per_hour`
(ladder.py). Attempts on a rung no longer in the ladder are counted at no price, and say so.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime

from sqlmodel import Session, col, select

from services.scheduler.ladder import ProviderPool
from services.scheduler.models import AttemptRow, JobRow
from services.scheduler.protocol import Usage, UsageLine
from shared.db import utcnow


def usage(session: Session, pool: ProviderPool, *, tenant: str, since: datetime | None) -> Usage:
    query = (
        select(AttemptRow)
        .join(JobRow, col(JobRow.id) == col(AttemptRow.job_id))
        .where(JobRow.tenant == tenant)
    )
    if since is not None:
        since = since if since.tzinfo is not None else since.replace(tzinfo=UTC)  # naive: UTC
        query = query.where(col(AttemptRow.started_at) >= since)
    now = utcnow()
    hours: dict[str, float] = defaultdict(float)
    attempts: dict[str, int] = defaultdict(int)
    for attempt in session.exec(query).all():
        ended = attempt.ended_at or now
        devices = pool.spec(attempt.provider).device_count if attempt.provider in pool else 1
        hours[attempt.provider] += (ended - attempt.started_at).total_seconds() / 3600 * devices
        attempts[attempt.provider] += 1
    lines = [_line(pool, name, attempts[name], hours[name]) for name in sorted(hours)]
    return Usage(
        since=since,
        data=lines,
        device_hours=sum(line.device_hours for line in lines),
        cost=sum(line.cost for line in lines),
    )


def _line(pool: ProviderPool, provider: str, attempts: int, device_hours: float) -> UsageLine:
    known = provider in pool
    price = pool.spec(provider).cost_per_hour if known else 0.0
    return UsageLine(
        provider=provider,
        device=pool.spec(provider).device if known else None,
        attempts=attempts,
        device_hours=device_hours,
        cost=device_hours * price,
        priced=known,
    )

"""What a tenant's training used, per provider: attempts, trained tokens, device-hours, cost.

An attempt's time runs from its start to its end (to now while it runs); its device-hours are
that time x the devices it was given, its cost the device-hours x the price per device-hour it
was placed at. Both are kept on the attempt (attempts.py), so a later change of the ladder does
not rewrite the past; an attempt from before they were kept is priced from the ladder, and one
on a rung no longer there at no price, saying so. Trained tokens are the non-pad tokens of the
steps it took (the trainer's reports): a step an attempt redid after resuming counts again.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlmodel import Session, col, select

from services.scheduler.ladder import ProviderPool
from services.scheduler.models import AttemptRow, JobRow
from services.scheduler.protocol import Usage, UsageLine
from shared.db import utcnow


@dataclass(frozen=True)
class Spend:
    seconds: float
    device_hours: float
    cost: float
    trained_tokens: int
    priced: bool = True

    def __add__(self, other: Spend) -> Spend:
        return Spend(
            self.seconds + other.seconds,
            self.device_hours + other.device_hours,
            self.cost + other.cost,
            self.trained_tokens + other.trained_tokens,
            self.priced and other.priced,
        )


NOTHING = Spend(0.0, 0.0, 0.0, 0)


def attempt_spend(attempt: AttemptRow, pool: ProviderPool, now: datetime) -> Spend:
    seconds = max(((attempt.ended_at or now) - attempt.started_at).total_seconds(), 0.0)
    known = attempt.provider in pool
    devices = attempt.device_count or (pool.spec(attempt.provider).device_count if known else 1)
    price = attempt.cost_per_hour
    if price is None:
        price = pool.spec(attempt.provider).cost_per_hour if known else 0.0
    hours = seconds / 3600 * devices
    tokens = max((attempt.tokens_last or 0) - (attempt.tokens_start or 0), 0)
    priced = attempt.cost_per_hour is not None or known
    return Spend(seconds, hours, hours * price, tokens, priced)


def total(attempts: Iterable[AttemptRow], pool: ProviderPool, now: datetime | None = None) -> Spend:
    now = now or utcnow()
    spent = NOTHING
    for attempt in attempts:
        spent += attempt_spend(attempt, pool, now)
    return spent


def tenant_attempts(session: Session, tenant: str, since: datetime | None) -> list[AttemptRow]:
    query = (
        select(AttemptRow)
        .join(JobRow, col(JobRow.id) == col(AttemptRow.job_id))
        .where(JobRow.tenant == tenant)
    )
    if since is not None:
        since = since if since.tzinfo is not None else since.replace(tzinfo=UTC)  # naive: UTC
        query = query.where(col(AttemptRow.started_at) >= since)
    return list(session.exec(query).all())


def usage(session: Session, pool: ProviderPool, *, tenant: str, since: datetime | None) -> Usage:
    if since is not None and since.tzinfo is None:
        since = since.replace(tzinfo=UTC)
    now = utcnow()
    spent: dict[str, Spend] = defaultdict(lambda: NOTHING)
    attempts: dict[str, int] = defaultdict(int)
    devices: dict[str, str | None] = {}
    for attempt in tenant_attempts(session, tenant, since):
        spent[attempt.provider] += attempt_spend(attempt, pool, now)
        attempts[attempt.provider] += 1
        known = pool.spec(attempt.provider).device if attempt.provider in pool else None
        devices[attempt.provider] = attempt.device or known
    lines = [
        UsageLine(
            provider=name,
            device=devices[name],
            attempts=attempts[name],
            device_hours=spent[name].device_hours,
            cost=spent[name].cost,
            trained_tokens=spent[name].trained_tokens,
            priced=spent[name].priced,
        )
        for name in sorted(spent)
    ]
    return Usage(
        since=since,
        data=lines,
        device_hours=sum(line.device_hours for line in lines),
        cost=sum(line.cost for line in lines),
        trained_tokens=sum(line.trained_tokens for line in lines),
    )

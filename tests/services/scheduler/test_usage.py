"""Usage per provider: each attempt's time x the rung's devices, priced at the ladder's rate;
a running attempt counts up to now; another tenant's attempts never show."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy.engine import Engine
from sqlalchemy.engine.url import URL

from services.scheduler import budgets, jobs
from services.scheduler.jobs import JobError
from services.scheduler.ladder import Ladder, ProviderPool, ProviderSpec
from services.scheduler.models import AttemptRow
from services.scheduler.protocol import JobCreate
from services.scheduler.usage import usage
from shared.db import make_engine, session_scope

T0 = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)


@pytest.fixture
def engine(sqlite_url: URL) -> Iterator[Engine]:
    engine = make_engine(sqlite_url)
    yield engine
    engine.dispose()


def _attempt(
    job_id: str, n: int, provider: str, start: datetime, hours: float | None
) -> AttemptRow:
    return AttemptRow(
        id=f"{job_id}-a{n}", job_id=job_id, number=n, provider=provider, ref="", work_dir="",
        state="exited" if hours is not None else "running", started_at=start,
        ended_at=start + timedelta(hours=hours) if hours is not None else None,
    )  # fmt: skip


def test_usage_is_device_hours_at_each_rungs_price_for_the_callers_attempts_only(
    engine: Engine,
) -> None:
    pool = ProviderPool(
        Ladder(
            providers=[
                ProviderSpec(name="own", kind="local", cost_per_hour=0.0),
                ProviderSpec(
                    name="gpus",
                    kind="local",
                    device="nvidia-h100",
                    device_count=2,
                    cost_per_hour=3.0,
                ),
            ]
        )
    )
    with session_scope(engine) as session:
        for job_id, tenant in (("ftjob-a", "acme"), ("ftjob-g", "globex")):
            jobs.create(
                session, job_id=job_id, tenant=tenant, dataset_id="ds",
                request=JobCreate(model="SmolLM2-135M-Instruct", training_file="ds"),
            )  # fmt: skip
        session.add(_attempt("ftjob-a", 1, "own", T0, 1.5))
        session.add(_attempt("ftjob-a", 2, "gpus", T0 + timedelta(hours=2), 0.5))  # 1 device-h
        session.add(_attempt("ftjob-a", 3, "retired", T0 + timedelta(hours=3), 2.0))
        session.add(_attempt("ftjob-g", 1, "gpus", T0, 10.0))  # another tenant's
        running = _attempt("ftjob-a", 4, "gpus", datetime.now(UTC) - timedelta(hours=1), None)
        session.add(running)
        session.commit()
        everything = usage(session, pool, tenant="acme", since=None)
        later = usage(
            session, pool, tenant="acme", since=(T0 + timedelta(hours=1)).replace(tzinfo=None)
        )
    lines = {line.provider: line for line in everything.data}
    assert set(lines) == {"own", "gpus", "retired"}
    assert (lines["own"].attempts, lines["own"].device_hours, lines["own"].cost) == (1, 1.5, 0.0)
    assert lines["gpus"].attempts == 2
    assert lines["gpus"].device_hours == pytest.approx(1.0 + 2.0, abs=0.01)  # running: up to now
    assert lines["gpus"].cost == pytest.approx(3.0 * 3.0, abs=0.05)
    assert (lines["retired"].priced, lines["retired"].cost) == (False, 0.0)
    assert everything.cost == pytest.approx(lines["gpus"].cost)
    # Since an hour after T0 (given without a zone: UTC), the first attempt is left out.
    assert {line.provider for line in later.data} == {"gpus", "retired"}


def test_a_job_reaches_its_limit_on_its_attempts_time_or_cost_and_not_on_queueing(
    engine: Engine,
) -> None:
    pool = ProviderPool(Ladder(providers=[ProviderSpec(name="gpus", kind="local")]))
    now = datetime.now(UTC)
    with session_scope(engine) as session:
        row = jobs.create(
            session, job_id="ftjob-b", tenant="acme", dataset_id="ds",
            request=JobCreate(model="SmolLM2-135M-Instruct", training_file="ds"),
        )  # fmt: skip
        # Two attempts of 100 s each, hours apart (the job waited queued in between), placed
        # at 36 USD an hour on 2 devices: 2 x 100 s x 2 devices x 0.01 USD a device-second.
        for n, start in ((1, now - timedelta(hours=5)), (2, now - timedelta(seconds=100))):
            attempt = _attempt("ftjob-b", n, "gpus", start, 100 / 3600 if n == 1 else None)
            attempt.device_count, attempt.cost_per_hour = 2, 36.0
            session.add(attempt)
        session.commit()
        assert budgets.job_limit_reached(session, pool, row) is None  # no limits
        row.max_duration_s = 250
        assert budgets.job_limit_reached(session, pool, row) is None
        row.max_duration_s = 190
        said = budgets.job_limit_reached(session, pool, row)
        assert said is not None
        assert said.startswith("its attempts have run 200 s of max_duration_s 190")
        row.max_duration_s, row.max_cost = None, 3.9
        said = budgets.job_limit_reached(session, pool, row)
        assert said == "its attempts have cost 4.00 of max_cost 3.9 USD"


def test_a_tenant_past_its_monthly_cap_is_refused_with_the_numbers_and_the_lower_cap_applies(
    engine: Engine,
) -> None:
    pool = ProviderPool(Ladder(providers=[ProviderSpec(name="gpus", kind="local")]))
    now = datetime.now(UTC)
    with session_scope(engine) as session:
        jobs.create(
            session, job_id="ftjob-m", tenant="acme", dataset_id="ds",
            request=JobCreate(model="SmolLM2-135M-Instruct", training_file="ds"),
        )  # fmt: skip
        attempt = _attempt("ftjob-m", 1, "gpus", budgets.month_start(now), 1.0)
        attempt.cost_per_hour = 10.0
        session.add(attempt)
        last_month = _attempt(
            "ftjob-m", 2, "gpus", budgets.month_start(now) - timedelta(days=3), 1.0
        )
        last_month.cost_per_hour = 1000.0  # another month: not counted
        session.add(last_month)
        session.commit()
        budgets.refuse_past_cap(session, pool, tenant="acme", platform_cap=None)  # no cap
        budgets.refuse_past_cap(session, pool, tenant="acme", platform_cap=10.5)
        budgets.set_cap(session, tenant="acme", cap=20.0)
        with pytest.raises(JobError) as refused:  # the platform's 9 is lower than the tenant's 20
            budgets.refuse_past_cap(session, pool, tenant="acme", platform_cap=9.0)
        assert refused.value.status == 429
        assert refused.value.code == "budget_exceeded"
        assert str(refused.value).startswith("monthly training budget spent: 10.00 of 9.00 USD")
        assert f"from {budgets.next_month(now):%Y-%m-%d}" in str(refused.value)
        state = budgets.budget(session, pool, tenant="acme", platform_cap=9.0)
        assert (state.monthly_cost_cap, state.effective_monthly_cost_cap) == (20.0, 9.0)
        assert state.spent == pytest.approx(10.0)
        budgets.refuse_past_cap(session, pool, tenant="globex", platform_cap=9.0)  # spent nothing

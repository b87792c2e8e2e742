"""Placement (services/scheduler/placement.py) with plain calls: priority, FIFO, the tenant cap,
the batch window, fairness across tenants, and the device count each rung gives a job; and, through
`Attempts` with a recording provider, that the attempt, its LaunchSpec and job.assigned carry it."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine.url import URL
from sqlmodel import select

from services.scheduler.attempts import Attempts
from services.scheduler.config import SchedulerSettings
from services.scheduler.ladder import Ladder, ProviderPool, ProviderSpec
from services.scheduler.memory import Method
from services.scheduler.models import AttemptRow, CheckpointRow, JobRow
from services.scheduler.placement import (
    LiveAttempt,
    Placement,
    QueuedJob,
    Size,
    device_count,
    place,
    size_of,
)
from services.scheduler.providers import Handle, LaunchSpec, Status
from shared import catalogue
from shared.catalogue import SMOLLM2_135M_INSTRUCT, CatalogueEntry
from shared.db import make_engine, session_scope
from shared.events import Event, JobAssigned

NOON = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
# Llama-2-7B's shape: a full fine-tune of one 512-token row needs ~118 GiB on one device, ~60
# on each of 2, ~41 on each of 3; LoRA ~18 on any number.
LLAMA_7B = CatalogueEntry(
    "Llama-2-7b", "Llama 2 7B", "test", 4096, "llama2", 6_738_415_616, "llama2",
    layers=32, hidden_size=4096, intermediate_size=11008,
)  # fmt: skip


def rung(
    name: str, capacity: int = 1, *, priority: int = 0, count: int = 1, memory_gib: float = 80.0
) -> ProviderSpec:
    return ProviderSpec(
        name=name, kind="local", priority=priority, capacity=capacity, device="nvidia-h100",
        device_count=count, device_memory_gib=memory_gib,
    )  # fmt: skip


def job(
    job_id: str,
    tenant: str = "acme",
    *,
    minute: int = 0,
    priority: str = "normal",
    method: Method | None = None,
) -> QueuedJob:
    size = None if method is None else Size(LLAMA_7B, method, rows=1, row_len=512)
    return QueuedJob(job_id, tenant, priority, NOON + timedelta(minutes=minute), size)


def placed(
    queued: list[QueuedJob],
    rungs: list[ProviderSpec],
    live: list[LiveAttempt] | None = None,
    now: datetime = NOON,
    **settings: Any,
) -> list[tuple[str, str, int]]:
    rules = SchedulerSettings(**{"tenant_max_running": 100, **settings})
    decided = place(queued, live or [], rungs, settings=rules, now=now)
    assert all(isinstance(p, Placement) for p in decided)
    return [(p.job_id, p.rung.name, p.device_count) for p in decided]


def test_urgent_goes_before_normal_before_batch_and_the_oldest_first_within() -> None:
    queued = [
        job("batch", minute=0, priority="batch"),
        job("normal-late", minute=2),
        job("normal-early", minute=1),
        job("urgent", minute=3, priority="urgent"),
    ]
    assert [p[0] for p in placed(queued, [rung("one", 4)])] == [
        "urgent", "normal-early", "normal-late", "batch",
    ]  # fmt: skip
    assert placed(queued, [rung("one", 1)]) == [("urgent", "one", 1)]


def test_a_tenant_at_its_cap_waits_while_others_take_the_room() -> None:
    queued = [job(f"a{n}", "acme", minute=n) for n in range(3)] + [job("g", "globex", minute=9)]
    live = [LiveAttempt("a-running", "one", "acme")]
    assert placed(queued, [rung("one", 10)], live, tenant_max_running=2) == [
        ("g", "one", 1), ("a0", "one", 1),
    ]  # fmt: skip


def test_batch_jobs_start_only_inside_the_batch_window() -> None:
    queued = [job("b", priority="batch"), job("n", minute=1)]
    closed = placed(queued, [rung("one", 4)], batch_window="22-6")
    assert closed == [("n", "one", 1)]
    night = NOON.replace(hour=23)
    assert [p[0] for p in placed(queued, [rung("one", 4)], now=night, batch_window="22-6")] == [
        "n", "b",
    ]  # fmt: skip


def test_a_tenant_that_queued_100_jobs_first_does_not_starve_one_that_queued_1_later() -> None:
    queued = [job(f"big-{n:03}", "big", minute=n) for n in range(100)]
    queued.append(job("small-0", "small", minute=200))
    # Three places: the big tenant's oldest, then the small tenant's only job, then big again.
    assert [p[0] for p in placed(queued, [rung("one", 3)])] == ["big-000", "small-0", "big-001"]
    # One place left, the big tenant running two: it goes to the small tenant.
    live = [LiveAttempt(f"big-run-{n}", "one", "big") for n in range(2)]
    assert placed(queued, [rung("one", 3)], live) == [("small-0", "one", 1)]


def test_urgent_goes_first_then_the_tenant_running_fewest_then_the_older_job() -> None:
    queued = [job("a", "acme", minute=0), job("g", "globex", minute=5, priority="urgent")]
    assert placed(queued, [rung("one", 1)]) == [("g", "one", 1)]
    queued = [job("a", "acme", minute=3), job("g", "globex", minute=5)]
    assert placed(queued, [rung("one", 1)]) == [("a", "one", 1)]
    # Priority outranks fewer live attempts: acme runs one and its job is urgent.
    live = [LiveAttempt("a-running", "other", "acme")]
    queued = [job("a", "acme", priority="urgent"), job("g", "globex", priority="normal")]
    assert placed(queued, [rung("one", 1), rung("other", 1)], live) == [("a", "one", 1)]
    # Of the same priority, the tenant running none goes first, though its job is younger.
    queued = [job("a", "acme", minute=0), job("g", "globex", minute=5)]
    assert placed(queued, [rung("one", 1), rung("other", 1)], live) == [("g", "one", 1)]


def test_jobs_take_the_first_rung_with_room_and_wait_when_every_rung_is_full() -> None:
    rungs = [rung("spare", 2, priority=1), rung("own", 1, priority=0)]
    queued = [job(f"j{n}", f"t{n}", minute=n) for n in range(4)]
    assert placed(queued, rungs) == [("j0", "own", 1), ("j1", "spare", 1), ("j2", "spare", 1)]
    live = [LiveAttempt(n, r, "t9") for n, r in [("x", "own"), ("y", "spare"), ("z", "spare")]]
    assert placed(queued, rungs, live) == []
    # A job with a live attempt is not placed again.
    assert placed([job("j0")], rungs, [LiveAttempt("j0", "spare", "acme")]) == []


def test_a_full_fine_tune_takes_the_fewest_devices_that_hold_it_and_lora_takes_one() -> None:
    eight = rung("eight", 4, count=8, memory_gib=80.0)
    queued = [job("full", "a", method="full"), job("lora", "b", minute=1, method="lora")]
    assert placed(queued, [eight]) == [("full", "eight", 2), ("lora", "eight", 1)]
    # A count that is no power of two is tried too: 3 devices of 45 GiB hold what 2 do not.
    assert device_count(Size(LLAMA_7B, "full", 1, 512), rung("three", count=3, memory_gib=45)) == 3
    # A job it cannot size takes all the rung's devices.
    assert placed([job("unsized")], [eight]) == [("unsized", "eight", 8)]


def test_a_rung_whose_devices_cannot_hold_the_job_is_skipped_for_the_next() -> None:
    small = rung("small", 4, priority=0, count=2, memory_gib=40.0)  # full needs ~60 on each of 2
    big = rung("big", 4, priority=1, count=8, memory_gib=80.0)
    queued = [job("full", "a", method="full"), job("lora", "b", minute=1, method="lora")]
    assert placed(queued, [small, big]) == [("full", "big", 2), ("lora", "small", 1)]
    # Fitting only a busy rung, it waits.
    assert placed(queued[:1], [small, big], [LiveAttempt("x", "big", "c")] * 4) == []
    assert (
        device_count(Size(LLAMA_7B, "lora", 1, 512), rung("tiny", count=8, memory_gib=16)) is None
    )


def test_the_size_comes_from_the_plan_the_recipe_wrote() -> None:
    plan = {"trainer": {"method": "full", "lora": {"rank": 8},
                        "hyperparameters": {"micro_batch_size": 4, "max_seq_len": 1024}}}  # fmt: skip
    row = JobRow(
        id="j", tenant="acme", status="queued", model=SMOLLM2_135M_INSTRUCT.id,
        training_file="f", request=b"{}", plan=json.dumps(plan).encode(), priority="urgent",
    )  # fmt: skip
    queued = QueuedJob.of(row)
    assert (queued.id, queued.tenant, queued.priority) == ("j", "acme", "urgent")
    assert queued.size == Size(SMOLLM2_135M_INSTRUCT, "full", rows=4, row_len=1024, lora_rank=8)
    assert size_of(SMOLLM2_135M_INSTRUCT.id, b"{}") is None  # an older plan
    assert size_of("s3://bucket/tenants/acme/models/own", json.dumps(plan).encode()) is None


class _Recording:
    """A provider that only records what it was asked to run."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.specs: list[LaunchSpec] = []

    def submit(self, spec: LaunchSpec) -> Handle:
        self.specs.append(spec)
        return Handle(self.name, spec.attempt_id, str(spec.work_dir))

    def poll(self, handle: Handle) -> Status:
        return Status("running")

    def cancel(self, handle: Handle, *, grace_s: float) -> Status:
        return Status("exited", 0)

    def logs(self, handle: Handle, *, tail_bytes: int = 20_000) -> str:
        return ""


async def test_an_attempt_keeps_its_rungs_device_the_count_chosen_and_the_price(
    sqlite_url: URL, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(catalogue.CATALOGUE, LLAMA_7B.id, LLAMA_7B)
    engine = make_engine(sqlite_url)
    events: list[Event] = []

    async def publish(event: Event) -> None:
        events.append(event)

    async def fail(job_id: str, code: str, message: str) -> None:
        raise AssertionError(message)

    eight = ProviderSpec(name="eight", kind="local", capacity=2, device="nvidia-h100",
                         device_count=8, device_memory_gib=80, cost_per_hour=3.5,
                         report_url="http://scheduler.internal:8003/")  # fmt: skip
    reports: list[str] = []

    def trainer_config(job: JobRow, attempt: str, prefix: str, base: str) -> dict[str, Any]:
        reports.append(base)
        return {"hyperparameters": {}}

    provider = _Recording("eight")
    attempts = Attempts(
        engine=engine, publish=publish,
        pool=ProviderPool(Ladder(providers=[eight]), {"eight": provider}),
        settings=SchedulerSettings(), work_root=tmp_path, output_prefix=lambda job: "s3://b/p",
        trainer_config=trainer_config, fail=fail,
    )  # fmt: skip
    for job_id, method in [("ftjob-full", "full"), ("ftjob-lora", "lora")]:
        plan = {"trainer": {"method": method,
                            "hyperparameters": {"micro_batch_size": 1, "max_seq_len": 512}}}  # fmt: skip
        with session_scope(engine) as session:
            session.add(JobRow(id=job_id, tenant="acme", status="queued", model=LLAMA_7B.id,
                               training_file="f", request=b"{}", plan=json.dumps(plan).encode()))  # fmt: skip
            session.commit()
    with session_scope(engine) as session:  # the LoRA job goes on from step 50, else 40, 30, 20
        for step in (10, 20, 30, 40, 50):
            session.add(CheckpointRow(id=f"c{step}", job_id="ftjob-lora", step=step,
                                      uri=f"s3://b/ckpt-{step}", pruned=step == 40))  # fmt: skip
        session.commit()
    try:
        await attempts.assign()
        with session_scope(engine) as session:
            rows = {a.job_id: a for a in session.exec(select(AttemptRow)).all()}
    finally:
        engine.dispose()
    assert {s.job_id: s.device_count for s in provider.specs} == {"ftjob-full": 2, "ftjob-lora": 1}
    resumes = {s.job_id: (s.resume_from, s.resume_fallbacks) for s in provider.specs}
    assert resumes == {
        "ftjob-full": (None, ()),
        "ftjob-lora": ("s3://b/ckpt-50", ("s3://b/ckpt-30", "s3://b/ckpt-20", "s3://b/ckpt-10")),
    }
    assert reports == ["http://scheduler.internal:8003"] * 2  # the rung's report_url
    assert {j: (a.device, a.device_count, a.cost_per_hour) for j, a in rows.items()} == {
        "ftjob-full": ("nvidia-h100", 2, 3.5), "ftjob-lora": ("nvidia-h100", 1, 3.5),
    }  # fmt: skip
    assigned = {e.job_id: e.resources for e in events if isinstance(e, JobAssigned)}
    assert assigned == {
        "ftjob-full": {"device": "nvidia-h100", "device_count": 2},
        "ftjob-lora": {"device": "nvidia-h100", "device_count": 1},
    }

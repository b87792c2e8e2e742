"""The trainer's signed reports: each becomes job state and one bus event; a replayed, stale,
forged or malformed one is refused; a retried one changes nothing."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr
from sqlalchemy.engine import Engine
from sqlalchemy.engine.url import URL

from services.scheduler import jobs, planning
from services.scheduler.config import SchedulerSettings
from services.scheduler.jobs import JobError
from services.scheduler.ladder import LOCAL_ONLY, ProviderPool
from services.scheduler.lifecycle import Scheduler
from services.scheduler.models import AttemptRow
from services.scheduler.protocol import JobCreate
from services.scheduler.webhooks import ReportReceiver
from shared.db import make_engine, session_scope
from shared.events import CheckpointSaved, Event, JobFailed, JobStarted, TrainingCompleted
from shared.reports import (
    CheckpointSavedReport,
    CompletedReport,
    FailedReport,
    ProgressReport,
    SkippedCheckpoint,
    StartedReport,
    TrainerReport,
)
from shared.signing import MemoryNonceStore, sign
from shared.storage import ObjectStore

MASTER = "test-webhook-master-secret"


@pytest.fixture
def engine(sqlite_url: URL) -> Iterator[Engine]:
    engine = make_engine(sqlite_url)
    yield engine
    engine.dispose()


@pytest.fixture
def published() -> list[Event]:
    return []


@pytest.fixture
async def receiver(
    engine: Engine, object_store: ObjectStore, published: list[Event], tmp_path: Path
) -> ReportReceiver:
    async def publish(event: Event) -> None:
        published.append(event)

    scheduler = Scheduler(
        engine=engine,
        store=object_store,
        publish=publish,
        pool=ProviderPool(LOCAL_ONLY),
        settings=SchedulerSettings(webhook_secret=SecretStr(MASTER), work_dir=tmp_path),
        data_dir=tmp_path,
        webhook_base="http://127.0.0.1:1",
        ingest_url="http://127.0.0.1:1",
        http=httpx.AsyncClient(),
    )
    with session_scope(engine) as session:
        row = jobs.create(
            session,
            job_id="ftjob-w",
            tenant="acme",
            request=JobCreate(model="SmolLM2-135M-Instruct", training_file="ds_1"),
            dataset_id="ds_1",
        )
        row.status = "queued"
        session.add(row)
        # The job's current attempt: only its reports are taken.
        session.add(
            AttemptRow(
                id="attempt-1", job_id="ftjob-w", provider="local", ref="", work_dir="",
                state="running",
            )
        )  # fmt: skip
        session.commit()
    return ReportReceiver(scheduler, nonces=MemoryNonceStore(), tolerance_s=300)


def _body(report: TrainerReport) -> bytes:
    return report.model_dump_json().encode()


def _signed(
    report: TrainerReport, secret: str | None = None, **kwargs: int
) -> tuple[dict[str, str], bytes]:
    body = _body(report)
    return sign(body, secret or planning.webhook_secret(MASTER, "ftjob-w"), **kwargs), body


COMMON = {"job_id": "ftjob-w", "attempt_id": "attempt-1", "tenant": "acme"}


async def test_started_runs_the_job_once_however_often_it_is_sent(
    receiver: ReportReceiver, published: list[Event], engine: Engine
) -> None:
    report = StartedReport(
        seq=0, world_size=1, total_steps=40, device="cpu", method="lora", **COMMON
    )
    for _ in range(2):  # the trainer retried: a new signature, the same report
        headers, body = _signed(report)
        await receiver.receive("ftjob-w", headers, body)
    assert [type(e) for e in published] == [JobStarted, JobStarted]
    assert {e.event_id for e in published} == {report.report_id}  # the stream keeps one
    with session_scope(engine) as session:
        job = jobs.get(session, tenant="acme", job_id="ftjob-w")
        assert job.status == "running"
        events, _ = jobs.events(session, job_id=job.id, after=None, limit=10)
        assert [e.message for e in events if "started" in e.message] == [
            "Training started on cpu (40 steps)"
        ]


async def test_a_steps_metrics_event_says_where_the_run_stands(
    receiver: ReportReceiver, published: list[Event], engine: Engine
) -> None:
    started = StartedReport(
        seq=0, world_size=1, total_steps=40, device="cpu", method="lora", **COMMON
    )
    await receiver.receive("ftjob-w", *_signed(started))
    report = ProgressReport(
        seq=1, step=10, total_steps=40, epoch=0.5, loss=0.75, learning_rate=2e-4, eta_s=31.26,
        **COMMON,
    )  # fmt: skip
    await receiver.receive("ftjob-w", *_signed(report))
    with session_scope(engine) as session:
        events, _ = jobs.events(session, job_id="ftjob-w", after=None, limit=10)
    (step,) = [e for e in events if e.type == "metrics"]
    assert step.message == "Step 10/40: training loss=0.7500"
    assert step.data == {
        "step": 10, "train_loss": 0.75, "learning_rate": 2e-4, "total_steps": 40, "eta_s": 31.3
    }  # fmt: skip


async def test_checkpoints_the_trainer_could_not_resume_from_become_one_warning(
    receiver: ReportReceiver, engine: Engine
) -> None:
    checkpoints = "s3://b/acme/ftjob-w/attempt-1/checkpoints"
    error = (
        f"{checkpoints}/step-00000040/model/adapter_model.safetensors: sha256 9f0c (2048 bytes), "
        "manifest says 41aa (2048 bytes)"
    )
    report = StartedReport(
        seq=0,
        world_size=1,
        total_steps=60,
        resumed_from=f"{checkpoints}/step-00000030",
        resume_skipped=[SkippedCheckpoint(uri=f"{checkpoints}/step-00000040", error=error)],
        device="cpu",
        method="lora",
        **COMMON,
    )
    for _ in range(2):  # a retried report adds nothing
        headers, body = _signed(report)
        await receiver.receive("ftjob-w", headers, body)
    with session_scope(engine) as session:
        events, _ = jobs.events(session, job_id="ftjob-w", after=None, limit=10)
    (warning,) = [e for e in events if e.level != "info"]
    assert warning.level == "warn"
    assert warning.message == (
        f"Resumed from step 30 ({checkpoints}/step-00000030), skipping 1 checkpoint it could not "
        f"use: step-00000040 ({error})"
    )
    assert warning.data == {
        "resumed_from": f"{checkpoints}/step-00000030",
        "resume_skipped": [{"uri": f"{checkpoints}/step-00000040", "error": error}],
    }
    assert len(events) == 2  # and "Training started ..., resumed from ..."


async def test_checkpoints_and_completion_become_events_with_the_last_checkpoint(
    receiver: ReportReceiver, published: list[Event], engine: Engine
) -> None:
    for step in (10, 20):
        headers, body = _signed(
            CheckpointSavedReport(
                seq=step,
                step=step,
                uri=f"s3://b/j/step-{step}",
                metrics={"loss": 1.0 / step},
                **COMMON,
            )
        )
        await receiver.receive("ftjob-w", headers, body)
    headers, body = _signed(
        CompletedReport(
            seq=30,
            artifact_uri="s3://b/j/final",
            steps=20,
            trained_tokens=1234,
            **COMMON,
        )
    )
    await receiver.receive("ftjob-w", headers, body)
    saved = [e for e in published if isinstance(e, CheckpointSaved)]
    assert [(e.step, e.uri) for e in saved] == [(10, "s3://b/j/step-10"), (20, "s3://b/j/step-20")]
    (completed,) = [e for e in published if isinstance(e, TrainingCompleted)]
    assert (completed.last_step, completed.last_checkpoint_uri, completed.trained_tokens) == (
        20,
        "s3://b/j/step-20",
        1234,
    )
    with session_scope(engine) as session:
        job = jobs.get(session, tenant="acme", job_id="ftjob-w")
        assert job.trained_tokens == 1234
        assert job.status == "queued"  # succeeded only once a version is registered
        listed, _ = jobs.checkpoints(session, job=job, after=None, limit=5)
        assert [(c.step_number, c.metrics.train_loss) for c in listed] == [(20, 0.05), (10, 0.1)]


async def test_a_failure_a_new_attempt_would_repeat_fails_the_job_with_its_reason(
    receiver: ReportReceiver, published: list[Event], engine: Engine
) -> None:
    headers, body = _signed(
        FailedReport(seq=3, reason="bad_dataset", message="row 3: no messages", **COMMON)
    )
    await receiver.receive("ftjob-w", headers, body)
    (failed,) = [e for e in published if isinstance(e, JobFailed)]
    assert failed.reason == "bad_dataset"
    with session_scope(engine) as session:
        job = jobs.to_api(jobs.get(session, tenant="acme", job_id="ftjob-w"))
    assert job.status == "failed"
    assert job.error is not None
    assert (job.error.code, job.error.message) == ("bad_dataset", "row 3: no messages")


async def test_any_other_failure_is_the_attempts_and_leaves_the_job_to_go_on(
    receiver: ReportReceiver, published: list[Event], engine: Engine
) -> None:
    # The poll that sees the trainer exit starts the next attempt (test_attempts.py).
    headers, body = _signed(
        FailedReport(seq=3, reason="nan_loss", message="loss is NaN at step 3", **COMMON)
    )
    await receiver.receive("ftjob-w", headers, body)
    assert not [e for e in published if isinstance(e, JobFailed)]
    with session_scope(engine) as session:
        assert jobs.get(session, tenant="acme", job_id="ftjob-w").status == "queued"
        attempt = session.get(AttemptRow, "attempt-1")
        assert attempt is not None
        assert (attempt.failure, attempt.reason) == ("nan_loss", "loss is NaN at step 3")


async def test_a_report_of_an_attempt_the_job_moved_on_from_is_refused(
    receiver: ReportReceiver, published: list[Event], engine: Engine
) -> None:
    with session_scope(engine) as session:
        session.add(
            AttemptRow(
                id="attempt-2", job_id="ftjob-w", number=2, provider="local", ref="",
                work_dir="", state="running",
            )
        )  # fmt: skip
        session.commit()
    stale = CheckpointSavedReport(seq=5, step=30, uri="s3://b/old/step-30", metrics={}, **COMMON)
    with pytest.raises(JobError) as caught:
        await receiver.receive("ftjob-w", *_signed(stale))
    assert caught.value.status == 409
    assert "attempt_id: attempt-1 is not the current attempt" in str(caught.value)
    assert published == []
    with session_scope(engine) as session:
        listed, _ = jobs.checkpoints(
            session, job=jobs.get(session, tenant="acme", job_id="ftjob-w"), after=None, limit=5
        )
    assert listed == []


async def test_forged_stale_replayed_and_malformed_reports_are_refused(
    receiver: ReportReceiver, published: list[Event]
) -> None:
    report = StartedReport(seq=0, world_size=1, device="cpu", method="lora", **COMMON)
    cases = [
        (_signed(report, secret=planning.webhook_secret(MASTER, "ftjob-other")), 401),
        (_signed(report, timestamp=int(time.time()) - 3600), 401),
    ]
    headers, body = _signed(report)
    await receiver.receive("ftjob-w", headers, body)
    cases.append(((headers, body), 401))  # the same signature again: a replay
    other = StartedReport(
        seq=0, world_size=1, device="cpu", method="lora", **{**COMMON, "job_id": "ftjob-x"}
    )
    cases.append((_signed(other), 400))
    garbage = b'{"kind": "started"}'
    cases.append(((sign(garbage, planning.webhook_secret(MASTER, "ftjob-w")), garbage), 400))
    for (headers, body), status in cases:
        with pytest.raises(JobError) as caught:
            await receiver.receive("ftjob-w", headers, body)
        assert caught.value.status == status
    assert len(published) == 1
    with pytest.raises(JobError) as caught:
        await receiver.receive("ftjob-missing", *_signed(report))
    assert caught.value.status == 404

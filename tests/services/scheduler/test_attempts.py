"""A job's attempts with real trainer processes (the tiny model) on the local provider, the
scheduler's report receiver over HTTP and its database: a trainer killed with SIGKILL, a NaN
loss, a provider's time limit, a paused job and a restarted scheduler each end with the job
trained to its last step, from checkpoints, in one continuous step count; a trainer that keeps
failing fails the job with each attempt's reason; jobs are placed on the ladder's first rung
with room, a tenant's beyond its cap wait."""

from __future__ import annotations

import asyncio
import itertools
import json
import signal
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import SecretStr
from sqlalchemy.engine import Engine
from sqlalchemy.engine.url import URL
from sqlmodel import col, select

from services.scheduler import api, jobs, planning
from services.scheduler.config import SchedulerSettings
from services.scheduler.jobs import JobError
from services.scheduler.ladder import Ladder, ProviderPool, ProviderSpec
from services.scheduler.lifecycle import Scheduler
from services.scheduler.models import AttemptRow, CheckpointRow, JobRow
from services.scheduler.protocol import JobCreate, Priority
from services.scheduler.usage import usage
from services.scheduler.webhooks import ReportReceiver
from shared.db import make_engine, session_scope
from shared.events import Event, JobEarlyStopRequested, JobRolledOver, TrainingCompleted
from shared.signing import MemoryNonceStore
from shared.storage import ObjectStore
from tests.plugins.infra import free_port
from tests.plugins.waiting import eventually
from tests.services.trainer.jobs import REPO_ROOT, tiny_job, tiny_snapshot

MASTER = "test-webhook-master-secret-for-attempts-0123"
WRAPPED_TRAINER = ("python", "-m", "tests.fakes.trainer_wrapper", "run")
pytestmark = pytest.mark.slow


@pytest.fixture
def engine(sqlite_url: URL) -> Any:
    engine = make_engine(sqlite_url)
    yield engine
    engine.dispose()


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_snapshot(tmp_path_factory.mktemp("snapshot"), count=24)


@dataclass
class Stack:
    scheduler: Scheduler
    events: list[Event]
    url: str

    @property
    def engine(self) -> Engine:
        return self.scheduler.engine


def local_ladder(*rungs: tuple[str, int, float | None]) -> Ladder:
    return Ladder(
        providers=[
            ProviderSpec(
                name=name, kind="local", priority=i, capacity=capacity, max_runtime_s=limit
            )
            for i, (name, capacity, limit) in enumerate(rungs)
        ]
    )


@asynccontextmanager
async def scheduler_stack(
    engine: Engine,
    store: ObjectStore,
    tmp_path: Path,
    config: Callable[[JobRow, str, str, str], dict[str, Any]],
    *,
    ladder: Ladder,
    port: int,
    settings: dict[str, Any] | None = None,
    command: tuple[str, ...] | None = None,
    env: dict[str, str] | None = None,
) -> AsyncIterator[Stack]:
    """A scheduler on `engine` whose report receiver listens on `port`, polling every 0.3 s;
    its attempts run `config(job, attempt id, output prefix, reports url)` as trainers."""
    events: list[Event] = []

    async def publish(event: Event) -> None:
        events.append(event)

    url = f"http://127.0.0.1:{port}"
    own = SchedulerSettings(
        webhook_secret=SecretStr(MASTER),
        work_dir=tmp_path / "work",
        cancel_grace_s=20,
        **(settings or {}),
    )
    scheduler = Scheduler(
        engine=engine,
        store=store,
        publish=publish,
        pool=ProviderPool(ladder),
        settings=own,
        data_dir=tmp_path,
        webhook_base=url,
        ingest_url="http://127.0.0.1:1",
        http=httpx.AsyncClient(),
    )
    attempts = scheduler.attempts
    attempts.output_prefix = lambda job: str(tmp_path / "out" / job.id)
    attempts.trainer_config = lambda job, attempt, prefix, base: config(
        job, attempt, prefix, f"{base}/internal/trainer/{job.id}/reports"
    )
    attempts.trainer_env = {
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(REPO_ROOT), **(env or {}),
    }  # fmt: skip
    if command is not None:
        attempts.trainer_command = command
    app = FastAPI()
    app.include_router(api.internal)
    app.state.reports = ReportReceiver(scheduler, nonces=MemoryNonceStore(), tolerance_s=300)

    @app.exception_handler(JobError)
    async def refused(_: Request, exc: JobError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, exc.status)

    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    serving = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.05)

    async def poll() -> None:
        while True:
            await attempts.check()
            await asyncio.sleep(0.3)

    polling = asyncio.create_task(poll())
    try:
        yield Stack(scheduler, events, url)
    finally:
        polling.cancel()
        server.should_exit = True
        await asyncio.gather(polling, serving, return_exceptions=True)
        await scheduler.http.aclose()


def tiny_config(
    model_dir: Path, snapshot: Path, epochs: int
) -> Callable[[JobRow, str, str, str], dict[str, Any]]:
    def config(job: JobRow, attempt_id: str, prefix: str, reports: str) -> dict[str, Any]:
        document = tiny_job(
            model_dir,
            snapshot,
            prefix,
            hyperparameters={"epochs": epochs},
            checkpoints={"every_n_steps": 2, "keep_last": 4},
        )
        secret = planning.webhook_secret(MASTER, job.id)
        webhook = {"url": reports, "secret": secret, "timeout_s": 2.0}
        return {**document, "job_id": job.id, "attempt_id": attempt_id, "webhook": webhook}

    return config


def queue_job(
    engine: Engine,
    job_id: str,
    tenant: str = "acme",
    priority: Priority = "normal",
    **fields: Any,
) -> None:
    with session_scope(engine) as session:
        row = jobs.create(
            session,
            job_id=job_id,
            tenant=tenant,
            request=JobCreate(
                model="SmolLM2-135M-Instruct", training_file="ds_1", priority=priority
            ),
            dataset_id="ds_1",
        )
        row.status, row.plan = "queued", b"{}"
        for name, value in fields.items():
            setattr(row, name, value)
        session.add(row)
        session.commit()


def set_job(engine: Engine, job_id: str, **fields: Any) -> None:
    with session_scope(engine) as session:
        row = session.get(JobRow, job_id)
        assert row is not None
        for name, value in fields.items():
            setattr(row, name, value)
        session.add(row)
        session.commit()


def messages_of(engine: Engine, job_id: str) -> list[str]:
    with session_scope(engine) as session:
        return [e.message for e in jobs.events(session, job_id=job_id, after=None, limit=100)[0]]


def attempts_of(engine: Engine, job_id: str) -> list[AttemptRow]:
    with session_scope(engine) as session:
        return list(
            session.exec(
                select(AttemptRow)
                .where(AttemptRow.job_id == job_id)
                .order_by(col(AttemptRow.number))
            ).all()
        )


def checkpoint_steps(engine: Engine, job_id: str) -> list[int]:
    with session_scope(engine) as session:
        rows = session.exec(select(CheckpointRow).where(CheckpointRow.job_id == job_id)).all()
        return sorted(row.step for row in rows)


def job_row(engine: Engine, job_id: str) -> JobRow:
    with session_scope(engine) as session:
        row = session.get(JobRow, job_id)
        assert row is not None
        return row


def trainer_of(attempt: AttemptRow) -> psutil.Process:
    """The trainer process under the attempt's launcher."""
    launcher = psutil.Process(int(attempt.ref.partition(":")[0]))
    [trainer] = launcher.children()
    return trainer


def assert_continuous(attempts: list[AttemptRow], total: int) -> None:
    """Each attempt went on from where the one before left a checkpoint; the last finished.
    (An attempt stopped while still starting up, on a loaded machine, trained no step: it is
    passed over.)"""
    assert attempts[-1].completed
    assert attempts[-1].last_step == total
    trained = [a for a in attempts if a.first_step is not None]
    assert trained[0].first_step == 1
    for before, after in itertools.pairwise(trained):
        assert after.resume_from is not None
        resumed = int(after.resume_from.rstrip("/").rsplit("-", 1)[1])
        assert resumed <= (before.last_step or 0)
        assert after.first_step == resumed + 1


# 24 examples packed into 384-token rows, 2 rows a micro-batch, 2 micro-batches a step.
STEPS_PER_EPOCH = 4


async def test_a_trainer_killed_with_sigkill_is_recovered_from_its_last_checkpoint(
    engine: Engine, object_store: ObjectStore, tiny_model_dir: Path, snapshot: Path, tmp_path: Path
) -> None:
    config = tiny_config(tiny_model_dir, snapshot, epochs=3)
    async with scheduler_stack(
        engine, object_store, tmp_path, config, ladder=local_ladder(("local", 1, None)),
        port=free_port(),
    ) as stack:  # fmt: skip
        queue_job(engine, "ftjob-kill")
        await eventually(
            lambda: len(checkpoint_steps(engine, "ftjob-kill")) >= 2, 120, "checkpoints"
        )
        [first] = attempts_of(engine, "ftjob-kill")
        trainer_of(first).send_signal(signal.SIGKILL)
        await eventually(lambda: any(a.completed for a in attempts_of(engine, "ftjob-kill")), 180,
                    "the job to finish in a new attempt")  # fmt: skip
    attempts = attempts_of(engine, "ftjob-kill")
    assert [a.number for a in attempts] == [1, 2]
    assert (attempts[0].state, attempts[0].returncode) == ("exited", -signal.SIGKILL)
    assert_continuous(attempts, 3 * STEPS_PER_EPOCH)
    [rolled] = [e for e in stack.events if isinstance(e, JobRolledOver)]
    assert (rolled.reason, rolled.resume_from) == ("crash", attempts[1].resume_from)
    assert job_row(engine, "ftjob-kill").status == "running"  # trained; awaiting registration
    # Listed as OpenAI's events (a warning's level is "warn"), saying it counts.
    assert any("(counts as a failed attempt)" in m for m in messages_of(engine, "ftjob-kill"))


async def test_a_nan_loss_goes_on_from_the_last_checkpoint_at_half_the_learning_rate(
    engine: Engine, object_store: ObjectStore, tiny_model_dir: Path, snapshot: Path, tmp_path: Path
) -> None:
    config = tiny_config(tiny_model_dir, snapshot, epochs=2)
    async with scheduler_stack(
        engine, object_store, tmp_path, config, ladder=local_ladder(("local", 1, None)),
        port=free_port(),
        command=WRAPPED_TRAINER,
        env={"TUNELOOP_TEST_NAN_MARKER": str(tmp_path / "nan-injected")},
    ):  # fmt: skip
        queue_job(engine, "ftjob-nan")
        await eventually(lambda: any(a.completed for a in attempts_of(engine, "ftjob-nan")), 180,
                    "the job to finish after its NaN")  # fmt: skip
    attempts = attempts_of(engine, "ftjob-nan")
    assert (tmp_path / "nan-injected").exists()
    assert [a.failure for a in attempts] == ["nan_loss", None]
    assert_continuous(attempts, 2 * STEPS_PER_EPOCH)
    second = tmp_path / "work" / "ftjob-nan" / attempts[1].id / "job.json"
    assert '"learning_rate": 0.0015' in second.read_text()  # 3e-3 halved


async def test_a_job_on_a_provider_with_a_20_second_limit_finishes_across_attempts(
    engine: Engine, object_store: ObjectStore, tiny_model_dir: Path, snapshot: Path, tmp_path: Path
) -> None:
    # Rolled over 8 s before the limit, each attempt runs ~12 s, start-up included; 0.1 s more a
    # micro-batch (2 a step, 48 steps) makes the job need longer than that on any machine.
    config = tiny_config(tiny_model_dir, snapshot, epochs=12)
    async with scheduler_stack(
        engine, object_store, tmp_path, config, ladder=local_ladder(("short", 1, 20.0)),
        port=free_port(), settings={"rollover_lead_s": 8.0}, command=WRAPPED_TRAINER,
        env={"TUNELOOP_TEST_STEP_DELAY_S": "0.1"},
    ) as stack:  # fmt: skip
        queue_job(engine, "ftjob-roll")
        await eventually(lambda: any(a.completed for a in attempts_of(engine, "ftjob-roll")), 280,
                    "the job to finish across attempts")  # fmt: skip
    attempts = attempts_of(engine, "ftjob-roll")
    assert len(attempts) >= 2
    assert all(a.stop_requested == "rollover" for a in attempts[:-1])
    assert_continuous(attempts, 12 * STEPS_PER_EPOCH)
    reasons = {e.reason for e in stack.events if isinstance(e, JobRolledOver)}
    assert reasons == {"time_limit"}
    assert job_row(engine, "ftjob-roll").status == "running"  # none of it counted as failing


async def test_a_paused_job_stops_at_a_checkpoint_and_resumes_from_it(
    engine: Engine, object_store: ObjectStore, tiny_model_dir: Path, snapshot: Path, tmp_path: Path
) -> None:
    config = tiny_config(tiny_model_dir, snapshot, epochs=4)
    async with scheduler_stack(
        engine, object_store, tmp_path, config, ladder=local_ladder(("local", 1, None)),
        port=free_port(),
    ) as stack:  # fmt: skip
        queue_job(engine, "ftjob-pause")
        await eventually(
            lambda: len(checkpoint_steps(engine, "ftjob-pause")) >= 1, 120, "a checkpoint"
        )
        paused = await stack.scheduler.pause(tenant="acme", job_id="ftjob-pause")
        assert paused.status == "paused"
        await eventually(lambda: attempts_of(engine, "ftjob-pause")[0].state != "running", 60,
                    "the trainer to stop")  # fmt: skip
        await asyncio.sleep(1.0)  # polls pass: a paused job gets no new attempt
        assert len(attempts_of(engine, "ftjob-pause")) == 1
        assert job_row(engine, "ftjob-pause").status == "paused"
        with pytest.raises(JobError) as again:
            await stack.scheduler.pause(tenant="acme", job_id="ftjob-pause")
        assert again.value.status == 409
        await stack.scheduler.resume(tenant="acme", job_id="ftjob-pause")
        await eventually(lambda: any(a.completed for a in attempts_of(engine, "ftjob-pause")), 180,
                    "the resumed job to finish")  # fmt: skip
    attempts = attempts_of(engine, "ftjob-pause")
    assert [a.stop_requested for a in attempts] == ["pause", None]
    assert_continuous(attempts, 4 * STEPS_PER_EPOCH)


async def test_a_restarted_scheduler_adopts_its_running_trainer_and_starts_no_other(
    engine: Engine, object_store: ObjectStore, tiny_model_dir: Path, snapshot: Path, tmp_path: Path
) -> None:
    config = tiny_config(tiny_model_dir, snapshot, epochs=4)
    port = free_port()
    ladder = local_ladder(("local", 1, None))
    async with scheduler_stack(engine, object_store, tmp_path, config, ladder=ladder, port=port):
        queue_job(engine, "ftjob-restart")
        await eventually(lambda: len(checkpoint_steps(engine, "ftjob-restart")) >= 1, 120,
                    "a checkpoint")  # fmt: skip
    # The scheduler is gone (its reports bounce meanwhile); its trainer runs on, detached.
    [attempt] = attempts_of(engine, "ftjob-restart")
    assert trainer_of(attempt).is_running()
    async with scheduler_stack(engine, object_store, tmp_path, config, ladder=ladder, port=port):
        await eventually(lambda: any(a.completed for a in attempts_of(engine, "ftjob-restart")), 180,
                    "the adopted trainer to finish")  # fmt: skip
    assert [a.id for a in attempts_of(engine, "ftjob-restart")] == [attempt.id]


async def test_a_trainer_that_keeps_failing_fails_the_job_with_each_attempts_reason(
    engine: Engine, object_store: ObjectStore, tmp_path: Path
) -> None:
    crash = (sys.executable, "-c", "import sys; print('boom'); sys.exit(1)")
    async with scheduler_stack(
        engine, object_store, tmp_path, lambda *_: {"hyperparameters": {}}, ladder=local_ladder(("local", 1, None)),
        port=free_port(), command=crash,
    ):  # fmt: skip
        queue_job(engine, "ftjob-crash")
        await eventually(
            lambda: job_row(engine, "ftjob-crash").status == "failed", 60, "the failure"
        )
    row = job_row(engine, "ftjob-crash")
    assert row.error is not None
    error = json.loads(row.error)
    assert error["code"] == "attempts_exhausted"
    assert error["message"] == (
        "gave up after 3 failed attempts (attempt 1: the trainer exited with status 1; "
        "attempt 2: the trainer exited with status 1; attempt 3: the trainer exited with status 1)"
    )


async def test_jobs_go_to_the_first_rung_with_room_and_a_tenants_beyond_its_cap_wait(
    engine: Engine, object_store: ObjectStore, tmp_path: Path
) -> None:
    sleeper = (sys.executable, "-c", "import time; time.sleep(60)")
    ladder = local_ladder(("own", 1, None), ("spare", 2, None))
    async with scheduler_stack(
        engine, object_store, tmp_path, lambda *_: {"hyperparameters": {}}, ladder=ladder, port=free_port(),
        command=sleeper, settings={"tenant_max_running": 2},
    ) as stack:  # fmt: skip
        for n, tenant in enumerate(["acme", "acme", "acme", "globex"]):
            queue_job(engine, f"ftjob-{n}", tenant)
            await asyncio.sleep(0.01)  # distinct creation times: first come, first served
        await eventually(lambda: len([a for n in range(4) for a in attempts_of(engine, f"ftjob-{n}")])
                    == 3, 30, "three attempts")  # fmt: skip
        placed = {f"ftjob-{n}": [a.provider for a in attempts_of(engine, f"ftjob-{n}")]
                  for n in range(4)}  # fmt: skip
        # acme's first on the own rung, its second on the spare one, its third waits (cap 2);
        # globex's takes the spare rung's second place.
        assert placed == {
            "ftjob-0": ["own"], "ftjob-1": ["spare"], "ftjob-2": [], "ftjob-3": ["spare"],
        }  # fmt: skip
        assert job_row(engine, "ftjob-2").status == "queued"
        await stack.scheduler.cancel(tenant="acme", job_id="ftjob-0")
        await eventually(lambda: [a.provider for a in attempts_of(engine, "ftjob-2")] == ["own"], 30,
                    "the waiting job to take the freed place")  # fmt: skip
        for n in (1, 2, 3):
            tenant = "globex" if n == 3 else "acme"
            await stack.scheduler.cancel(tenant=tenant, job_id=f"ftjob-{n}")
    assert all(not psutil.pid_exists(int(a.ref.partition(":")[0])) or
               psutil.Process(int(a.ref.partition(":")[0])).status() == psutil.STATUS_ZOMBIE
               for n in range(4) for a in attempts_of(engine, f"ftjob-{n}"))  # fmt: skip


async def test_urgent_jobs_go_first_and_batch_jobs_wait_for_their_window(
    engine: Engine, object_store: ObjectStore, tmp_path: Path
) -> None:
    sleeper = (sys.executable, "-c", "import time; time.sleep(60)")
    hour = datetime.now(UTC).hour
    closed = f"{(hour + 1) % 24}-{(hour + 2) % 24}"  # a window that is not now
    # Queued before the scheduler starts: its first pass sees all three.
    for job_id, priority in [("ftjob-n", "normal"), ("ftjob-b", "batch"), ("ftjob-u", "urgent")]:
        queue_job(engine, job_id, priority=priority)  # type: ignore[arg-type]
        await asyncio.sleep(0.01)
    async with scheduler_stack(
        engine, object_store, tmp_path, lambda *_: {"hyperparameters": {}},
        ladder=local_ladder(("one", 1, None)), port=free_port(), command=sleeper,
        settings={"batch_window": closed, "tenant_max_running": 5},
    ) as stack:  # fmt: skip

        def running() -> list[str]:
            return [j for j in ("ftjob-n", "ftjob-b", "ftjob-u")
                    if any(a.state in ("pending", "running") for a in attempts_of(engine, j))]  # fmt: skip

        await eventually(lambda: running() == ["ftjob-u"], 30, "the urgent job first")
        await stack.scheduler.cancel(tenant="acme", job_id="ftjob-u")
        await eventually(lambda: running() == ["ftjob-n"], 30, "then the normal one")
        await stack.scheduler.cancel(tenant="acme", job_id="ftjob-n")
        await asyncio.sleep(1.5)  # polls pass: the batch job waits for its window
        assert running() == []
        assert job_row(engine, "ftjob-b").status == "queued"
        stack.scheduler.settings.batch_window = f"{hour}-{(hour + 1) % 24 or 24}"
        await eventually(lambda: running() == ["ftjob-b"], 30, "the batch job in its window")
        await stack.scheduler.cancel(tenant="acme", job_id="ftjob-b")


def finished(stack: Stack, job_id: str) -> list[TrainingCompleted]:
    return [e for e in stack.events if isinstance(e, TrainingCompleted) and e.job_id == job_id]


async def test_a_job_past_its_cost_budget_stops_and_ends_training_at_its_checkpoint(
    engine: Engine, object_store: ObjectStore, tiny_model_dir: Path, snapshot: Path, tmp_path: Path
) -> None:
    config = tiny_config(tiny_model_dir, snapshot, epochs=12)
    # 3,600 USD an hour: a dollar a second of the attempt.
    ladder = Ladder(providers=[ProviderSpec(name="pricey", kind="local", cost_per_hour=3600.0)])
    async with scheduler_stack(
        engine, object_store, tmp_path, config, ladder=ladder, port=free_port(),
        command=WRAPPED_TRAINER, env={"TUNELOOP_TEST_STEP_DELAY_S": "0.1"},
    ) as stack:  # fmt: skip
        queue_job(engine, "ftjob-cost")
        await eventually(
            lambda: len(checkpoint_steps(engine, "ftjob-cost")) >= 1, 120, "a checkpoint"
        )
        # Spent already: set once training is under way, so the test waits on no clock.
        set_job(engine, "ftjob-cost", max_cost=1.0)
        await eventually(lambda: bool(finished(stack, "ftjob-cost")), 120, "training to end")
        with session_scope(engine) as session:
            spent = usage(session, stack.scheduler.pool, tenant="acme", since=None)
    [attempt] = attempts_of(engine, "ftjob-cost")
    assert (attempt.stop_requested, attempt.completed) == ("budget", False)
    [done] = finished(stack, "ftjob-cost")
    steps = checkpoint_steps(engine, "ftjob-cost")
    assert done.last_step == steps[-1] < 12 * STEPS_PER_EPOCH
    assert done.attempt_id == attempt.id
    row = job_row(engine, "ftjob-cost")
    assert row.status == "running"  # trained; the evaluator decides among what it scored
    assert attempt.tokens_start == 0
    assert (attempt.tokens_last or 0) > 0
    assert row.trained_tokens == attempt.tokens_last == spent.trained_tokens
    assert (attempt.device, attempt.device_count, attempt.cost_per_hour) == ("cpu", 1, 3600.0)
    assert spent.cost > 1.0
    said = messages_of(engine, "ftjob-cost")
    assert any(m.startswith("Stopping: its attempts have cost") for m in said)
    assert f"Training ended at step {done.last_step}; waiting for the final evaluation" in said


async def test_an_early_stop_ends_training_of_a_running_and_of_a_paused_job(
    engine: Engine, object_store: ObjectStore, tiny_model_dir: Path, snapshot: Path, tmp_path: Path
) -> None:
    config = tiny_config(tiny_model_dir, snapshot, epochs=12)
    async with scheduler_stack(
        engine, object_store, tmp_path, config, ladder=local_ladder(("local", 2, None)),
        port=free_port(), command=WRAPPED_TRAINER, env={"TUNELOOP_TEST_STEP_DELAY_S": "0.1"},
    ) as stack:  # fmt: skip
        scheduler = stack.scheduler
        for job_id in ("ftjob-run", "ftjob-idle"):
            queue_job(engine, job_id)
        await eventually(lambda: all(checkpoint_steps(engine, j) for j in ("ftjob-run", "ftjob-idle")),
                    120, "a checkpoint of each")  # fmt: skip
        await scheduler.pause(tenant="acme", job_id="ftjob-idle")
        await eventually(lambda: attempts_of(engine, "ftjob-idle")[0].state != "running", 60,
                    "the paused trainer to stop")  # fmt: skip
        for job_id in ("ftjob-run", "ftjob-idle"):
            request = JobEarlyStopRequested(
                tenant="acme", job_id=job_id, reason="the task score fell 3 evals in a row"
            )
            await scheduler.early_stop(request)
            await scheduler.early_stop(request)  # redelivered: nothing more happens
        await eventually(lambda: bool(finished(stack, "ftjob-run")), 120, "the running job to end")
        await asyncio.sleep(1.0)  # polls pass: neither job gets another attempt
    [running] = attempts_of(engine, "ftjob-run")
    assert running.stop_requested == "early_stop"
    for job_id in ("ftjob-run", "ftjob-idle"):
        [done] = finished(stack, job_id)
        assert done.last_step == checkpoint_steps(engine, job_id)[-1] < 12 * STEPS_PER_EPOCH
        assert len(attempts_of(engine, job_id)) == 1
        assert job_row(engine, job_id).status == "running"
        said = messages_of(engine, job_id)
        assert said.count(
            "Early stop requested by the evaluator: the task score fell 3 evals in a row"
        ) == 1  # fmt: skip
        assert sum(m.startswith("Training ended at step") for m in said) == 1


async def test_a_rung_too_short_to_train_a_step_fails_the_job_instead_of_rolling_over_forever(
    engine: Engine, object_store: ObjectStore, tmp_path: Path
) -> None:
    never_reports = (sys.executable, "-c", "import time; time.sleep(60)")
    async with scheduler_stack(
        engine, object_store, tmp_path, lambda *_: {"hyperparameters": {}},
        ladder=local_ladder(("tiny", 1, 1.0)), port=free_port(), command=never_reports,
        settings={"rollover_lead_s": 0.0},
    ):  # fmt: skip
        queue_job(engine, "ftjob-short")
        await eventually(
            lambda: job_row(engine, "ftjob-short").status == "failed", 60, "the failure"
        )
    attempts = attempts_of(engine, "ftjob-short")
    assert [a.stop_requested for a in attempts] == ["rollover"] * 3
    error = json.loads(job_row(engine, "ftjob-short").error or b"{}")
    assert error["code"] == "no_progress"
    assert "last 3 attempts were rolled over before they trained a step" in error["message"]

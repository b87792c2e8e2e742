"""A job's life: accepted, planned, launched, reported on, scored, registered, finished.

`Scheduler` is what the API routes and the event handlers call; it owns the order of things
and nothing about HTTP or FastStream. Every bus event it publishes for a trainer report carries
the report's id as its event id, and every row it writes for one is keyed by it: a retried
report or a redelivered event changes nothing.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from services.scheduler import budgets, datasets, jobs, memory, planning
from services.scheduler.attempts import Attempts
from services.scheduler.config import SchedulerSettings
from services.scheduler.jobs import JobError
from services.scheduler.ladder import ProviderPool
from services.scheduler.models import CheckpointRow, JobEventRow, JobRow
from services.scheduler.protocol import TERMINAL, JobCreate
from services.scheduler.throughput import THROUGHPUT
from shared import catalogue
from shared.db import session_scope, utcnow
from shared.events import (
    BaseScored,
    BestCheckpointChanged,
    DatasetBuildFailed,
    DatasetBuilt,
    EvalCompleted,
    EvalDecided,
    Event,
    JobCancelled,
    JobCreated,
    JobEarlyStopRequested,
    JobFailed,
    JobPlanned,
    JobQueued,
    JobSucceeded,
    ModelRegistered,
)
from shared.storage import ObjectStore, parse_uri

log = logging.getLogger("tuneloop.scheduler")
Publish = Callable[[Event], Awaitable[None]]
EvalEvent = BaseScored | EvalCompleted | BestCheckpointChanged | EvalDecided


@dataclass
class Scheduler:
    engine: Engine
    store: ObjectStore
    publish: Publish
    pool: ProviderPool
    settings: SchedulerSettings
    data_dir: Path
    webhook_base: str  # this service's own URL, for the trainer's reports
    ingest_url: str
    http: httpx.AsyncClient
    # Plans started in the background: held, so the loop does not collect them mid-way.
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    attempts: Attempts = field(init=False)

    def __post_init__(self) -> None:
        self.attempts = Attempts(
            engine=self.engine,
            publish=self.publish,
            pool=self.pool,
            settings=self.settings,
            work_root=self._work_dir(),
            output_prefix=self.output_prefix,
            trainer_config=self._trainer_config,
            fail=self.fail,
            trainer_env=trainer_env(self.settings.trainer_threads),
            own_address=self.webhook_base,
        )

    # --- accepting a job ------------------------------------------------------------------

    async def create(
        self, request: JobCreate, *, tenant: str, authorization: dict[str, str]
    ) -> JobRow:
        await self.check_new_job(request.model, tenant=tenant)
        job_id = jobs.new_job_id()
        dataset = await datasets.resolve(
            self.http,
            self.ingest_url,
            authorization=authorization,
            job_id=job_id,
            model=request.model,
            training_file=request.training_file,
            validation_file=request.validation_file,
        )
        return await self.accept(job_id, request, tenant=tenant, dataset=dataset)

    async def check_new_job(self, model: str, *, tenant: str) -> None:
        """What refuses a new job before its data is looked at: a model outside the catalogue
        (422), one that fits no rung (422), the tenant's month's budget spent (429)."""
        self.check_model(model, tenant=tenant)
        await asyncio.to_thread(self._check_budget, tenant)

    def check_model(self, model: str, *, tenant: str, param: str = "model") -> None:
        try:
            catalogue.check_base_model(model, tenant=tenant, bucket=self.store.bucket, field=param)
            entry = catalogue.get_entry(model, field=param)
        except catalogue.CatalogueError as exc:
            raise JobError(422, str(exc), param=param) from None
        self._check_fits(entry, param)

    async def accept(
        self,
        job_id: str,
        request: JobCreate,
        *,
        tenant: str,
        dataset: datasets.DatasetRef,
        note: str | None = None,
    ) -> JobRow:
        """Record the job on its dataset (`note`: a first event saying who started it) and plan
        it now if the dataset is built; else it waits for `dataset.built`."""

        def insert() -> JobRow:
            with session_scope(self.engine) as session:
                row = jobs.create(
                    session, job_id=job_id, tenant=tenant, request=request, dataset_id=dataset.id
                )
                if note is not None:
                    jobs.add_event(session, job_id, note)
                jobs.add_event(
                    session, job_id, f"Validating training file: {request.training_file}"
                )
                return row

        row = await asyncio.to_thread(insert)
        await self.dataset_status(row.id, dataset)
        return row

    async def dataset_status(self, job_id: str, dataset: datasets.DatasetRef) -> None:
        """Act on what the job's dataset is now: built, plan it (once); failed, fail it."""
        if dataset.status == "built" and dataset.uri:
            task = asyncio.create_task(self._start_logged(job_id, dataset.uri))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        elif dataset.status == "failed":
            await self.fail(
                job_id,
                "invalid_training_file",
                f"dataset {dataset.id} failed to build",
                "training_file",
            )

    def _check_fits(self, entry: catalogue.CatalogueEntry, param: str = "model") -> None:
        """Refuse (422, with the numbers) a model whose smallest run fits no rung of the ladder."""
        shortfalls = []
        for rung in self.pool.ordered():
            estimate = memory.smallest_run(entry, rung.device, rung.device_count)
            if memory.fits(estimate, rung.device_memory_gib):
                return
            shortfalls.append(
                f"on {rung.name} ({rung.device}, {rung.device_memory_gib:g} GiB a device) it "
                f"needs {estimate.describe()}"
            )
        raise JobError(
            422,
            f"{param}: {entry.id} fits no provider of the ladder even in its smallest LoRA run "
            f"(1 row of {min(memory.SMALLEST_ROW, entry.context_length)} tokens): "
            + "; ".join(shortfalls),
            param=param,
        )

    def _check_budget(self, tenant: str) -> None:
        with session_scope(self.engine) as session:
            budgets.refuse_past_cap(
                session, self.pool, tenant=tenant, platform_cap=self.settings.tenant_monthly_cap
            )

    async def on_dataset_built(self, event: DatasetBuilt) -> None:
        for job_id in await asyncio.to_thread(self._waiting_for, event.tenant, event.dataset_id):
            await self.start(job_id, event.uri)

    async def on_dataset_failed(self, event: DatasetBuildFailed) -> None:
        for job_id in await asyncio.to_thread(self._waiting_for, event.tenant, event.dataset_id):
            await self.fail(job_id, "invalid_training_file", event.reason, "training_file")

    def _waiting_for(self, tenant: str, dataset_id: str) -> list[str]:
        with session_scope(self.engine) as session:
            rows = session.exec(
                select(JobRow).where(
                    JobRow.tenant == tenant,
                    JobRow.dataset_id == dataset_id,
                    JobRow.status == "validating_files",
                )
            ).all()
            return [row.id for row in rows]

    # --- planning and launching ------------------------------------------------------------

    async def _start_logged(self, job_id: str, uri: str) -> None:
        try:
            await self.start(job_id, uri)
        except Exception:
            log.exception("job %s: start failed", job_id)

    async def start(self, job_id: str, dataset_uri: str) -> None:
        """Plan the job from its built dataset and launch its first attempt (once)."""
        device = THROUGHPUT[self.settings.local_device]
        job = await asyncio.to_thread(self._claim, job_id, dataset_uri)
        if job is None:
            return  # planned already (a redelivered dataset.built)
        try:
            meta, train, n_eval = await asyncio.to_thread(
                planning.read_snapshot, self.store, dataset_uri
            )
            result, document = planning.plan_job(job, meta, train, n_eval, device)
        except Exception as exc:
            await self.fail(
                job_id,
                "invalid_training_file",
                f"the dataset cannot be trained on: {exc}",
                "training_file",
            )
            return
        eta = utcnow() + timedelta(seconds=result.estimated_s)
        await asyncio.to_thread(self._save_plan, job_id, document, eta)
        version = str(meta.get("version", "")) or dataset_uri.rstrip("/").rsplit("/", 1)[-1]
        await self.publish(
            JobCreated(
                tenant=job.tenant,
                job_id=job.id,
                base_model=job.model,
                dataset_uri=dataset_uri,
                method="lora",
                hyperparameters=document["hyperparameters"],
                suffix=job.suffix,
            )
        )
        await self.publish(
            JobPlanned(
                tenant=job.tenant,
                job_id=job.id,
                base_model=job.model,
                dataset_id=job.dataset_id or "",
                dataset_version=version,
                dataset_uri=dataset_uri,
                task_kind=document["task_kind"],
                steps=document["steps"],
                eval_every=document["eval_every"],
                eval_items=document["eval_items"],
                fine_tuned_model=document["fine_tuned_model"],
                auto_deploy=job.auto_deploy,
            )
        )
        await self.publish(JobQueued(tenant=job.tenant, job_id=job.id, position=0))
        await self.attempts.assign()

    def _claim(self, job_id: str, dataset_uri: str) -> JobRow | None:
        """Take the job for planning once (a redelivered dataset.built finds it taken). The
        status stays validating_files until the plan is saved with it: `queued` always comes
        with its hyperparameters and decisions."""
        with session_scope(self.engine) as session:
            taken = session.execute(
                sa.update(JobRow)
                .where(
                    col(JobRow.id) == job_id,
                    col(JobRow.status) == "validating_files",
                    col(JobRow.dataset_uri).is_(None),
                )
                .values(dataset_uri=dataset_uri)
            )
            session.commit()
            if taken.rowcount != 1:  # type: ignore[attr-defined]
                return None
            return session.get(JobRow, job_id)

    def _save_plan(self, job_id: str, document: dict[str, Any], eta: Any) -> None:
        # The events first: a job seen `queued` already shows every decision and its plan.
        with session_scope(self.engine) as session:
            for decision in document["decisions"]:
                jobs.add_event(
                    session,
                    job_id,
                    f"{decision['name']} = {decision['value']}: {decision['reason']}",
                    data={"decision": decision},
                )
            jobs.add_event(
                session,
                job_id,
                f"Planned {document['steps']} steps, evaluations every {document['eval_every']} "
                f"steps on {document['eval_items']} items; about {document['estimated_s']:.0f} s",
            )
            row = session.get(JobRow, job_id)
            assert row is not None
            row.plan = jobs.dumps(document)
            row.estimated_finish = eta
            if row.status == "validating_files":  # not cancelled meanwhile
                row.status = "queued"
            session.add(row)
            session.commit()

    def _trainer_config(
        self, job: JobRow, attempt_id: str, output_prefix: str, reports_base: str
    ) -> dict[str, Any]:
        return planning.trainer_config(
            job,
            json.loads(job.plan or b"{}"),
            attempt_id=attempt_id,
            output_prefix=output_prefix,
            webhook_url=f"{reports_base}/internal/trainer/{job.id}/reports",
            secret=planning.webhook_secret(self.settings.webhook_secret.get_secret_value(), job.id),
            torch_threads=self.settings.trainer_threads,
        )

    def output_prefix(self, job: JobRow) -> str:
        return f"s3://{self.store.bucket}/tenants/{job.tenant}/jobs/{job.id}"

    def _work_dir(self) -> Path:
        return self.settings.work_dir or (self.data_dir / "jobs")

    def job(self, job_id: str) -> JobRow:
        with session_scope(self.engine) as session:
            row = session.get(JobRow, job_id)
            if row is None:
                raise JobError(404, f"fine-tuning job {job_id!r} not found")
            return row

    # --- ending -----------------------------------------------------------------------------

    async def fail(self, job_id: str, code: str, message: str, param: str | None = None) -> None:
        def fail() -> JobRow | None:
            with session_scope(self.engine) as session:
                row = session.get(JobRow, job_id)
                if row is None or row.status in TERMINAL:
                    return None
                jobs.finish(row, "failed", error={"code": code, "message": message, "param": param})
                session.add(row)
                session.commit()
                jobs.add_event(session, job_id, f"Job failed ({code}): {message}", level="error")
                session.refresh(row)
                return row

        row = await asyncio.to_thread(fail)
        if row is not None:
            await self.publish(
                JobFailed(tenant=row.tenant, job_id=job_id, reason=code, message=message)
            )

    async def cancel(self, *, tenant: str, job_id: str) -> JobRow:
        """Cancelled first, then the trainer signalled: the attempt poller, seeing the trainer
        exit on the signal, must find a job that has ended, not one to fail."""

        def mark() -> JobRow:
            with session_scope(self.engine) as session:
                row = jobs.get(session, tenant=tenant, job_id=job_id)
                if row.status in TERMINAL:
                    raise JobError(
                        409, f"job {job_id} is already {row.status}", param="fine_tuning_job_id"
                    )
                jobs.finish(row, "cancelled")
                session.add(row)
                session.commit()
                jobs.add_event(session, job_id, "Job cancelled")
                session.refresh(row)
                return row

        row = await asyncio.to_thread(mark)
        await self.publish(JobCancelled(tenant=tenant, job_id=job_id, requested_by="api"))
        await self.attempts.cancel(job_id)
        return row

    async def pause(self, *, tenant: str, job_id: str) -> JobRow:
        """Paused at once (so the attempt that stops is not followed by another), then its
        trainer asked to stop: it checkpoints, and `resume` goes on from there."""

        def mark() -> JobRow:
            with session_scope(self.engine) as session:
                row = jobs.get(session, tenant=tenant, job_id=job_id)
                if row.status not in ("queued", "running"):
                    raise JobError(
                        409, f"job {job_id} is {row.status}: only a queued or running job "
                        "pauses", param="fine_tuning_job_id",
                    )  # fmt: skip
                row.status = "paused"
                session.add(row)
                session.commit()
                jobs.add_event(
                    session, job_id, "Pause requested: the trainer checkpoints and stops"
                )
                session.refresh(row)
                return row

        row = await asyncio.to_thread(mark)
        for attempt in await asyncio.to_thread(self.attempts.live_attempts, job_id):
            await self.attempts.request_stop(attempt, "pause")
        return row

    async def resume(self, *, tenant: str, job_id: str) -> JobRow:
        def mark() -> JobRow:
            with session_scope(self.engine) as session:
                row = jobs.get(session, tenant=tenant, job_id=job_id)
                if row.status != "paused":
                    raise JobError(
                        409, f"job {job_id} is {row.status}: only a paused job resumes",
                        param="fine_tuning_job_id",
                    )  # fmt: skip
                row.status = "queued"
                session.add(row)
                session.commit()
                jobs.add_event(session, job_id, "Resumed: queued for its next attempt")
                session.refresh(row)
                return row

        row = await asyncio.to_thread(mark)
        await self.attempts.assign()
        return row

    async def early_stop(self, event: JobEarlyStopRequested) -> None:
        """Stop the run now, keeping the best checkpoint: a running trainer is stopped (it
        checkpoints, and training ends there: attempts.py); a job between attempts or paused
        ends its training at its newest checkpoint at once."""

        def note() -> tuple[str, bool] | None:
            with session_scope(self.engine) as session:
                row = session.get(JobRow, event.job_id)
                if row is None or row.tenant != event.tenant or row.status in TERMINAL:
                    return None
                if row.status == "validating_files":
                    return None  # nothing trained: the request is about a job not started
                jobs.add_event(
                    session,
                    row.id,
                    f"Early stop requested by the {event.requested_by}: {event.reason}",
                    event_id=event.event_id,
                )
                return row.status, row.plan is not None

        state = await asyncio.to_thread(note)
        if state is None:
            return
        live = await asyncio.to_thread(self.attempts.live_attempts, event.job_id)
        for attempt in live:
            await self.attempts.request_stop(attempt, "early_stop")
        if not live:
            await self.attempts.finish_training(event.job_id)

    # --- what the evaluator and the hoster decided -------------------------------------------

    async def on_eval(self, event: EvalEvent) -> None:
        await asyncio.to_thread(self._record_eval, event)

    def _record_eval(self, event: EvalEvent) -> None:
        with session_scope(self.engine) as session:
            record_eval(session, event)

    async def on_registered(self, event: ModelRegistered) -> None:
        if event.job_id is None:
            return
        job = await asyncio.to_thread(self._succeed, event)
        if job is None:
            return
        await self.publish(
            JobSucceeded(
                tenant=job.tenant,
                job_id=job.id,
                artifact_uri=event.artifact_uri,
                metrics=dict(event.scores),
            )
        )
        await asyncio.to_thread(self._prune, job.id, event.artifact_uri)

    def _succeed(self, event: ModelRegistered) -> JobRow | None:
        with session_scope(self.engine) as session:
            job = session.get(JobRow, event.job_id)
            if job is None or job.tenant != event.tenant or job.status in TERMINAL:
                return None
            job.fine_tuned_model = event.model_id
            job.best_step = event.step if event.step is not None else job.best_step
            job.gate = event.gate
            jobs.finish(job, "succeeded")
            session.add(job)
            session.commit()
            jobs.add_event(
                session,
                job.id,
                f"Registered {event.model_id} (version {event.model_version}); the job succeeded",
            )
            session.refresh(job)
            return job

    def _prune(self, job_id: str, chosen_uri: str) -> None:
        """Keep the chosen checkpoint and the last; delete the rest from object storage."""
        with session_scope(self.engine) as session:
            rows = list(
                session.exec(
                    select(CheckpointRow)
                    .where(CheckpointRow.job_id == job_id, col(CheckpointRow.pruned).is_(False))
                    .order_by(col(CheckpointRow.step))
                ).all()
            )
            keep = {rows[-1].id} if rows else set()
            keep |= {r.id for r in rows if chosen_uri.rstrip("/").startswith(r.uri.rstrip("/"))}
            for row in rows:
                if row.id in keep:
                    continue
                self.store.delete_dir(str(parse_uri(row.uri)))
                row.pruned = True
                session.add(row)
            session.commit()


def record_eval(session: Session, event: EvalEvent) -> None:
    """What the evaluator said of a job, on the job and as its events (once each)."""
    job = session.get(JobRow, event.job_id)
    if job is None or job.tenant != event.tenant:
        return
    if isinstance(event, EvalCompleted):
        _record_score(session, job, event.step, event.scores)
        return
    if isinstance(event, EvalDecided):
        # Each score comes on a subscription of its own, in no order with this one: one not
        # recorded yet is recorded now, ahead of the decision, so a job never ends with a
        # checkpoint's score missing from its events (the late one then adds nothing).
        for step, score in sorted(event.scores.items()):
            _record_score(session, job, step, {"task_score": score})
    message, data = eval_message(job, event)
    session.add(job)
    session.commit()
    jobs.add_event(session, job.id, message, type="metrics", data=data, event_id=event.event_id)


def _record_score(session: Session, job: JobRow, step: int, scores: dict[str, float]) -> None:
    """A checkpoint's score: on its checkpoint and as one job event, keyed by job and step (from
    eval.completed or from the decision, whichever comes first; the other adds nothing)."""
    event_id = f"{job.id}-score-{step}"
    if session.get(JobEventRow, event_id) is not None:
        return
    score = scores.get("task_score")
    row = session.exec(
        select(CheckpointRow).where(CheckpointRow.job_id == job.id, CheckpointRow.step == step)
    ).first()
    if row is not None and score is not None:
        row.task_score = score
        session.add(row)
        session.commit()
    shown = f"{score:.3f}" if score is not None else "not reported"
    message, data = f"Step {step}: task score {shown}", {"step": step, **scores}
    jobs.add_event(session, job.id, message, type="metrics", data=data, event_id=event_id)


def eval_message(
    job: JobRow, event: BaseScored | BestCheckpointChanged | EvalDecided
) -> tuple[str, dict[str, Any]]:
    if isinstance(event, BaseScored):
        job.base_score = event.score
        return f"Base model scored {event.score:.3f} on {event.sample_count} eval items", {
            "base_score": event.score
        }
    if isinstance(event, BestCheckpointChanged):
        job.best_step = event.step
        return f"Best checkpoint is now step {event.step} ({event.metric} {event.value:.3f})", {
            "best_step": event.step,
            event.metric: event.value,
        }
    job.best_step, job.gate = event.best_step, event.gate
    verdict = {
        "passed": "passed the gate",
        "rejected": "was rejected by the gate",
        None: "was not gated (no evals)",
    }[event.gate]
    return (
        f"Chose step {event.best_step} (score {event.best_score}, base {event.base_score}); it {verdict}. {event.gate_reason}".strip(),
        {
            "best_step": event.best_step,
            "best_score": event.best_score,
            "base_score": event.base_score,
            "gate": event.gate,
        },
    )


def trainer_env(threads: int) -> dict[str, str]:
    """What the trainer's environment adds (the local provider starts from the scheduler's own;
    a remote one from its image's, so no secret of the scheduler travels)."""
    # The trainer's own thread pools follow the plan, so it leaves the eval engine its share.
    return {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}

"""A job's attempts: placed on the ladder, watched, stopped, and followed by the next one.

A job runs as a series of attempts, each one run of its trainer on one provider, numbered from 1;
the highest is the current one. Every attempt writes under its own prefix
(`.../jobs/<job>/<attempt>/`), and the scheduler takes reports (so records checkpoints) from the
current attempt only (webhooks.py): an old attempt still finishing a step can never make its
checkpoint the one the job goes on from.

- Placing: queued jobs, oldest first, at most `tenant_max_running` of a tenant at once, each on
  the first rung of the ladder (by priority) with room (`capacity` live attempts). A job that
  fits nowhere now waits, queued.
- Watching, every poll: an attempt past its provider's `max_runtime_s` less the lead time is
  rolled over (SIGTERM: the trainer checkpoints and exits, and the next attempt resumes there);
  one silent for `heartbeat_timeout_s` is stopped and counts as failed.
- After an attempt ends, the job goes on in a new one from its newest checkpoint unless it
  completed, was cancelled or paused, or failed for a reason that retrying cannot fix (a bad
  config or dataset). A NaN loss goes on at half the learning rate. Preemptions, rollovers and
  stops from outside (a drained node's SIGTERM) are free; crashes, lost and hung trainers and
  NaNs count, and past `max_failed_attempts` the job fails, saying why each attempt ended.
- The scheduler keeps all of this in its tables (the stop it asked for included), so after a
  restart it finds live trainers again through their providers' handles and goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from services.scheduler import jobs, memory
from services.scheduler.config import SchedulerSettings
from services.scheduler.ladder import ProviderPool, ProviderSpec
from services.scheduler.memory import training_memory
from services.scheduler.models import AttemptRow, CheckpointRow, JobRow
from services.scheduler.protocol import TERMINAL
from services.scheduler.providers import TRAINER, Handle, LaunchSpec, Status
from shared import catalogue
from shared.db import session_scope, utcnow
from shared.events import Event, JobAssigned, JobRolledOver
from shared.reports import (
    CheckpointSavedReport,
    CompletedReport,
    FailedReport,
    ProgressReport,
    TrainerReport,
)

log = logging.getLogger("tuneloop.scheduler.attempts")
Publish = Callable[[Event], Awaitable[None]]
# (job, attempt id, the attempt's output prefix) -> the trainer's config document.
TrainerConfig = Callable[[JobRow, str, str], dict[str, Any]]
StopReason = Literal["rollover", "pause", "cancel", "heartbeat"]

LIVE = ("pending", "running")
_PRIORITY_ORDER = {"urgent": 0, "normal": 1, "batch": 2}
# Failures the trainer reports that a new attempt would only repeat.
PERMANENT_FAILURES = frozenset({"bad_config", "bad_dataset"})


@dataclass(frozen=True)
class Ending:
    """How an attempt ended, and what that means for its job."""

    counts: bool  # against the job's failed-attempt budget
    why: str  # a person's words
    reason: str  # JobRolledOver.reason of the attempt that follows


def ending(attempt: AttemptRow) -> Ending:
    """Read an ended attempt: who stopped it, what the trainer said, what the provider saw."""
    if attempt.stop_requested == "rollover":
        return Ending(False, "rolled over before the provider's time limit", "time_limit")
    if attempt.stop_requested == "heartbeat":
        return Ending(True, "stopped after it stopped reporting", "crash")
    if attempt.failure == "nan_loss":
        return Ending(True, "the loss became NaN", "nan_loss")
    if attempt.state == "preempted":
        return Ending(False, f"the provider took its machine away ({attempt.reason})", "preempted")
    if attempt.failure is not None:
        return Ending(True, f"the trainer failed ({attempt.failure}: {attempt.reason})", "crash")
    if attempt.state == "exited" and attempt.returncode == 0:
        return Ending(False, "stopped from outside (SIGTERM) before finishing", "preempted")
    if attempt.state == "lost":
        return Ending(True, f"lost ({attempt.reason})", "crash")
    return Ending(True, f"the trainer {attempt.reason}", "crash")


@dataclass
class Attempts:
    engine: Engine
    publish: Publish
    pool: ProviderPool
    settings: SchedulerSettings
    work_root: Path
    # The job's storage prefix (s3://.../jobs/<job>); each attempt writes under its own below.
    output_prefix: Callable[[JobRow], str]
    trainer_config: TrainerConfig
    # Scheduler.fail: (job id, code, message).
    fail: Callable[[str, str, str], Awaitable[None]]
    trainer_env: dict[str, str] = field(default_factory=dict)
    trainer_command: tuple[str, ...] = TRAINER
    _stops: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    _refusals: set[tuple[str, str]] = field(default_factory=set)
    _placing: asyncio.Lock = field(default_factory=asyncio.Lock)

    # --- placing ------------------------------------------------------------------------------

    async def assign(self) -> None:
        """Start an attempt for every queued job that may run now (once at a time: two passes
        at once could both see the same free rung)."""
        async with self._placing:
            for job_id, rung in await asyncio.to_thread(self._placements):
                try:
                    await self._launch(job_id, rung)
                except Exception as exc:  # the provider refused or is away: the job waits
                    said = f"Provider {rung.name} refused the attempt: {exc}"
                    if (job_id, said) not in self._refusals:  # said once, not every poll
                        self._refusals.add((job_id, said))
                        log.warning("job %s: %s", job_id, said)
                        await asyncio.to_thread(self._note, job_id, said)

    def _placements(self) -> list[tuple[str, ProviderSpec]]:
        with session_scope(self.engine) as session:
            queued = sorted(
                session.exec(
                    select(JobRow)
                    .where(JobRow.status == "queued", col(JobRow.plan).is_not(None))
                    .order_by(col(JobRow.created_at), col(JobRow.id))
                ).all(),
                key=lambda row: _PRIORITY_ORDER.get(row.priority, 1),  # stable: FIFO within
            )
            live = session.exec(select(AttemptRow).where(col(AttemptRow.state).in_(LIVE))).all()
            tenants = {row.id: row.tenant for row in queued}
            busy_jobs = {attempt.job_id for attempt in live}
            per_rung = Counter(attempt.provider for attempt in live)
            per_tenant = Counter(self._tenant_of(session, a.job_id, tenants) for a in live)
        placements = []
        batch_may_start = self.settings.in_batch_window(utcnow().hour)
        for job in queued:
            if job.id in busy_jobs or per_tenant[job.tenant] >= self.settings.tenant_max_running:
                continue
            if job.priority == "batch" and not batch_may_start:
                continue  # held to the batch window
            room = [r for r in self.pool.ordered() if per_rung[r.name] < r.capacity]
            if not room:
                break  # every rung is full: the rest wait their turn
            rung = next((r for r in room if plan_fits(job, r)), None)
            if rung is None:
                continue  # a rung it fits is busy (create refused jobs that fit none)
            placements.append((job.id, rung))
            per_rung[rung.name] += 1
            per_tenant[job.tenant] += 1
        return placements

    @staticmethod
    def _tenant_of(session: Session, job_id: str, known: dict[str, str]) -> str:
        if job_id not in known:
            row = session.get(JobRow, job_id)
            known[job_id] = row.tenant if row is not None else ""
        return known[job_id]

    async def _launch(self, job_id: str, rung: ProviderSpec) -> None:
        attempt_id = f"attempt-{uuid.uuid4().hex[:12]}"
        job, previous, resume_from, halvings = await asyncio.to_thread(self._next_attempt, job_id)
        if job.status != "queued":
            return  # paused or cancelled meanwhile
        config = self.trainer_config(job, attempt_id, f"{self.output_prefix(job)}/{attempt_id}")
        rate = config["hyperparameters"].get("learning_rate")
        if halvings and rate is not None:  # a NaN loss before: go on more gently
            config["hyperparameters"]["learning_rate"] = rate * 0.5**halvings
        spec = LaunchSpec(
            job_id=job.id,
            attempt_id=attempt_id,
            tenant=job.tenant,
            config=config,
            work_dir=self.work_root / job.id / attempt_id,
            resume_from=resume_from,
            env=self.trainer_env,
            device=rung.device,
            device_count=rung.device_count,
            max_runtime_s=rung.max_runtime_s,
            command=self.trainer_command,
        )
        handle = await asyncio.to_thread(self.pool.get(rung.name).submit, spec)
        number = (previous.number + 1) if previous is not None else 1
        await asyncio.to_thread(
            self._record, job.id, attempt_id, number, handle, resume_from, halvings, previous
        )
        resources = {"device": rung.device, "device_count": rung.device_count}
        await self.publish(
            JobAssigned(
                tenant=job.tenant,
                job_id=job.id,
                attempt_id=attempt_id,
                provider=rung.name,
                resources=resources,
                resume_from=resume_from,
            )
        )
        if previous is not None:
            await self.publish(
                JobRolledOver(
                    tenant=job.tenant,
                    job_id=job.id,
                    from_attempt_id=previous.id,
                    to_attempt_id=attempt_id,
                    reason=ending(previous).reason,
                    resume_from=resume_from,
                )
            )

    def _next_attempt(self, job_id: str) -> tuple[JobRow, AttemptRow | None, str | None, int]:
        """The job, its latest attempt, the checkpoint to go on from, and how many times the
        learning rate is halved (once per attempt that ended in a NaN loss)."""
        with session_scope(self.engine) as session:
            job = session.get(JobRow, job_id)
            assert job is not None
            attempts = session.exec(
                select(AttemptRow)
                .where(AttemptRow.job_id == job_id)
                .order_by(col(AttemptRow.number).desc())
            ).all()
            checkpoint = session.exec(
                select(CheckpointRow)
                .where(CheckpointRow.job_id == job_id, col(CheckpointRow.pruned).is_(False))
                .order_by(col(CheckpointRow.step).desc())
            ).first()
            halvings = sum(1 for a in attempts if a.failure == "nan_loss")
            previous = attempts[0] if attempts else None
            return job, previous, checkpoint.uri if checkpoint else None, halvings

    def _record(
        self,
        job_id: str,
        attempt_id: str,
        number: int,
        handle: Handle,
        resume_from: str | None,
        halvings: int,
        previous: AttemptRow | None,
    ) -> None:
        with session_scope(self.engine) as session:
            session.add(
                AttemptRow(
                    id=attempt_id,
                    job_id=job_id,
                    number=number,
                    provider=handle.provider,
                    ref=handle.ref,
                    work_dir=handle.work_dir,
                    state="pending",
                    resume_from=resume_from,
                )
            )
            session.commit()
            jobs.add_event(session, job_id, _started_message(number, handle, resume_from,
                                                             halvings, previous))  # fmt: skip

    # --- watching -----------------------------------------------------------------------------

    async def check(self) -> None:
        """Poll the live attempts; act on the ended ones; place what waits."""
        for attempt in await asyncio.to_thread(self.live_attempts):
            handle = Handle(attempt.provider, attempt.ref, attempt.work_dir)
            if attempt.provider not in self.pool:
                continue  # a rung removed from the ladder: its attempts are left to end alone
            status = await asyncio.to_thread(self.pool.get(attempt.provider).poll, handle)
            if status.state in LIVE:
                await self._watch(attempt, status)
            else:
                await self._ended(attempt, status)
        await self.assign()

    async def _watch(self, attempt: AttemptRow, status: Status) -> None:
        if status.state != attempt.state:
            await asyncio.to_thread(self._set_state, attempt.id, status.state)
        if attempt.stop_requested is not None:
            self._ensure_stopping(attempt)  # asked before a restart: ask again
            return
        why = self._overdue(attempt, status)
        if why is not None:
            await self.request_stop(attempt, why)

    def _overdue(self, attempt: AttemptRow, status: Status) -> StopReason | None:
        now = utcnow()
        limit = self.pool.spec(attempt.provider).max_runtime_s
        # Only a running one: stopping an attempt still waiting for a machine gains nothing.
        if limit is not None and status.state == "running":
            age = (now - attempt.started_at).total_seconds()
            if age >= max(limit - self.settings.rollover_lead_s, 0.0):
                return "rollover"
        if status.state == "running":
            heard = attempt.last_report_at or attempt.started_at
            if (now - heard).total_seconds() >= self.settings.heartbeat_timeout_s:
                return "heartbeat"
        return None

    def _set_state(self, attempt_id: str, state: str) -> None:
        with session_scope(self.engine) as session:
            row = session.get(AttemptRow, attempt_id)
            if row is not None and row.state in LIVE:
                row.state = state
                session.add(row)
                session.commit()

    async def request_stop(self, attempt: AttemptRow, why: StopReason) -> None:
        """Ask the attempt's trainer to stop (SIGTERM: it checkpoints), remembering why, so the
        poll that sees it end (after a restart too) knows what comes next."""
        await asyncio.to_thread(self._mark_stop, attempt.id, why)
        log.info("attempt %s of job %s: stopping (%s)", attempt.id, attempt.job_id, why)
        self._ensure_stopping(attempt)

    def _mark_stop(self, attempt_id: str, why: StopReason) -> None:
        with session_scope(self.engine) as session:
            row = session.get(AttemptRow, attempt_id)
            if row is not None and row.stop_requested is None:
                row.stop_requested = why
                session.add(row)
                session.commit()

    def _ensure_stopping(self, attempt: AttemptRow) -> None:
        if attempt.id in self._stops:
            return
        handle = Handle(attempt.provider, attempt.ref, attempt.work_dir)
        provider = self.pool.get(attempt.provider)
        # In the background: the grace period can be long, and the poll goes on meanwhile.
        task = asyncio.create_task(
            asyncio.to_thread(provider.cancel, handle, grace_s=self.settings.cancel_grace_s),
            name=f"stop-{attempt.id}",
        )
        self._stops[attempt.id] = task  # type: ignore[assignment]
        task.add_done_callback(lambda _: self._stops.pop(attempt.id, None))

    async def drain(self) -> None:
        """Wait for the stops in flight (the service is stopping)."""
        for task in list(self._stops.values()):
            with contextlib.suppress(Exception):
                await task

    # --- after an attempt -----------------------------------------------------------------------

    async def _ended(self, attempt: AttemptRow, status: Status) -> None:
        ended = await asyncio.to_thread(
            self._end, attempt.id, status.state, status.returncode, status.reason
        )
        if ended is None:
            return
        job = await asyncio.to_thread(self._job, attempt.job_id)
        if job is None or job.status in TERMINAL or ended.completed:
            return
        if ended.stop_requested == "cancel":
            return
        if ended.stop_requested == "pause" or job.status == "paused":
            await asyncio.to_thread(self._paused, job.id, ended)
            return
        if ended.failure in PERMANENT_FAILURES:
            return  # the job failed when the trainer said so (webhooks.py)
        await self._go_on(job, ended)

    def _end(
        self, attempt_id: str, state: str, returncode: int | None, reason: str
    ) -> AttemptRow | None:
        with session_scope(self.engine) as session:
            row = session.get(AttemptRow, attempt_id)
            if row is None or row.state not in LIVE:
                return None
            row.state, row.returncode, row.reason = state, returncode, (reason or "")[:1000]
            row.ended_at = utcnow()
            session.add(row)
            session.commit()
            session.refresh(row)
            return row

    def _job(self, job_id: str) -> JobRow | None:
        with session_scope(self.engine) as session:
            return session.get(JobRow, job_id)

    async def _go_on(self, job: JobRow, ended: AttemptRow) -> None:
        """Queue the job for its next attempt, or fail it once it has failed too often."""
        verdict = ending(ended)
        failures = await asyncio.to_thread(self._failures, job.id)
        if failures and len(failures) >= self.settings.max_failed_attempts:
            said = "; ".join(f"attempt {n}: {why}" for n, why in failures)
            await self.fail(
                job.id,
                "attempts_exhausted",
                f"gave up after {len(failures)} failed attempts ({said})",
            )
            return
        await asyncio.to_thread(self._requeue, job.id, ended, verdict)

    def _failures(self, job_id: str) -> list[tuple[int, str]]:
        with session_scope(self.engine) as session:
            ended = session.exec(
                select(AttemptRow)
                .where(AttemptRow.job_id == job_id, col(AttemptRow.state).not_in(LIVE))
                .order_by(col(AttemptRow.number))
            ).all()
            return [(a.number, ending(a).why) for a in ended if ending(a).counts]

    def _requeue(self, job_id: str, ended: AttemptRow, verdict: Ending) -> None:
        with session_scope(self.engine) as session:
            job = session.get(JobRow, job_id)
            if job is None or job.status in TERMINAL or job.status == "paused":
                return
            job.status = "queued"
            session.add(job)
            session.commit()
            counted = " (counts as a failed attempt)" if verdict.counts else ""
            jobs.add_event(
                session,
                job_id,
                f"Attempt {ended.number} ended: {verdict.why}{counted}; the job goes on in a "
                "new attempt from its newest checkpoint",
                level="warning" if verdict.counts else "info",
            )

    def _paused(self, job_id: str, ended: AttemptRow) -> None:
        with session_scope(self.engine) as session:
            jobs.add_event(
                session,
                job_id,
                f"Paused: attempt {ended.number} stopped after step {ended.last_step}; resume "
                "goes on from its checkpoint",
            )

    # --- what the API and the reports change -----------------------------------------------------

    def current(self, session: Session, job_id: str) -> AttemptRow | None:
        return session.exec(
            select(AttemptRow)
            .where(AttemptRow.job_id == job_id)
            .order_by(col(AttemptRow.number).desc())
        ).first()

    def live_attempts(self, job_id: str | None = None) -> list[AttemptRow]:
        """The attempts still pending or running, of one job or of all."""
        query = select(AttemptRow).where(col(AttemptRow.state).in_(LIVE))
        if job_id is not None:
            query = query.where(AttemptRow.job_id == job_id)
        with session_scope(self.engine) as session:
            return list(session.exec(query).all())

    async def cancel(self, job_id: str) -> None:
        """Stop the job's live attempts and wait for them (cancel, with the grace period)."""
        for attempt in await asyncio.to_thread(self.live_attempts, job_id):
            await asyncio.to_thread(self._mark_stop, attempt.id, "cancel")
            handle = Handle(attempt.provider, attempt.ref, attempt.work_dir)
            provider = self.pool.get(attempt.provider)
            status = await asyncio.to_thread(
                provider.cancel, handle, grace_s=self.settings.cancel_grace_s
            )
            await asyncio.to_thread(
                self._end, attempt.id, "cancelled", status.returncode, status.reason
            )

    def take_report(self, job_id: str, report: TrainerReport) -> bool:
        """Note a trainer's report on its attempt (when it was heard from, the steps, how it
        ended); False for a report of an attempt that is not the job's current one, whose
        checkpoints and results the job must not take."""
        with session_scope(self.engine) as session:
            current = self.current(session, job_id)
            if current is None or current.id != report.attempt_id:
                return False
            current.last_report_at = utcnow()
            step = _step_of(report)
            if step is not None:
                current.first_step = step if current.first_step is None else current.first_step
                current.last_step = max(step, current.last_step or 0)
            if isinstance(report, CompletedReport):
                current.completed = True
            elif isinstance(report, FailedReport) and report.reason != "interrupted":
                current.failure = report.reason
                current.reason = report.message[:1000]
            session.add(current)
            session.commit()
            return True

    def _note(self, job_id: str, message: str) -> None:
        with session_scope(self.engine) as session:
            jobs.add_event(session, job_id, message, level="warning")


def plan_fits(job: JobRow, rung: ProviderSpec) -> bool:
    """Whether the job's plan (rows a micro-batch, row length, method) fits the rung's devices;
    true when the job's model or plan cannot be sized (a tenant's own model, an older plan)."""
    entry = catalogue.CATALOGUE.get(job.model)
    trainer = json.loads(job.plan or b"{}").get("trainer", {})
    hyper = trainer.get("hyperparameters", {})
    if entry is None or "micro_batch_size" not in hyper or "max_seq_len" not in hyper:
        return True
    estimate = training_memory(
        entry,
        method=trainer.get("method", "lora"),
        precision=memory.device_precision(rung.device),
        rows=int(hyper["micro_batch_size"]),
        row_len=int(hyper["max_seq_len"]),
        devices=rung.device_count,
        lora_rank=int(trainer.get("lora", {}).get("rank", 16)),
    )
    return memory.fits(estimate, rung.device_memory_gib)


def _step_of(report: TrainerReport) -> int | None:
    if isinstance(report, ProgressReport | CheckpointSavedReport):
        return report.step
    if isinstance(report, CompletedReport):
        return report.steps
    return None


def _started_message(
    number: int,
    handle: Handle,
    resume_from: str | None,
    halvings: int,
    previous: AttemptRow | None,
) -> str:
    parts = [f"Attempt {number} started on the {handle.provider} provider"]
    if resume_from:
        parts.append(f"resuming from {resume_from.rstrip('/').rsplit('/', 1)[-1]}")
    if previous is not None:
        parts.append(f"after attempt {previous.number} {ending(previous).why}")
    if halvings:
        parts.append(f"learning rate x{0.5**halvings:g}")
    return "; ".join(parts)

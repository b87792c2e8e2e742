"""A job's attempts: placed on the ladder, watched, stopped, and followed by the next one.

A job runs as a series of attempts, each one run of its trainer on one provider, numbered from 1;
the highest is the current one. Every attempt writes under its own prefix
(`.../jobs/<job>/<attempt>/`), and the scheduler takes reports (so records checkpoints) from the
current attempt only (webhooks.py): an old attempt still finishing a step can never make its
checkpoint the one the job goes on from.

- Placing (placement.py decides): queued jobs, each free place to the highest priority and,
  among those, the tenant running fewest, at most `tenant_max_running` of a tenant at once, each on the first rung of the ladder (by
  priority) with room (`capacity` live attempts) and a device count that holds it. A job that
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
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from services.scheduler import budgets, jobs
from services.scheduler.config import SchedulerSettings
from services.scheduler.ladder import ProviderPool, ProviderSpec
from services.scheduler.models import AttemptRow, CheckpointRow, JobEventRow, JobRow
from services.scheduler.placement import LiveAttempt, QueuedJob, place
from services.scheduler.protocol import TERMINAL, EventLevel
from services.scheduler.providers import TRAINER, Handle, LaunchSpec, Status
from shared.db import session_scope, utcnow
from shared.events import Event, JobAssigned, JobRolledOver, TrainingCompleted
from shared.reports import (
    CheckpointSavedReport,
    CompletedReport,
    FailedReport,
    ProgressReport,
    StartedReport,
    TrainerReport,
)

log = logging.getLogger("tuneloop.scheduler.attempts")
Publish = Callable[[Event], Awaitable[None]]
# (job, attempt id, the attempt's output prefix, the base URL its reports go to) -> the
# trainer's config document.
TrainerConfig = Callable[[JobRow, str, str, str], dict[str, Any]]
# Older checkpoints an attempt may fall back to when the newest fails its check (the trainer's
# --resume-fallback), newest first.
RESUME_FALLBACKS = 3
StopReason = Literal["rollover", "pause", "cancel", "heartbeat", "budget", "early_stop"]
# Stops that end training where the trainer checkpoints, keeping the best (no next attempt).
FINISHING: frozenset[str] = frozenset({"budget", "early_stop"})

LIVE = ("pending", "running")
_ENDS_HERE = "training ends at the checkpoint the trainer saves now, and the best one is kept"
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
    # The scheduler's own address: where a local rung's trainers report (ladder.reports_base).
    own_address: str = "http://127.0.0.1"
    trainer_command: tuple[str, ...] = TRAINER
    _stops: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    _refusals: set[tuple[str, str]] = field(default_factory=set)
    _placing: asyncio.Lock = field(default_factory=asyncio.Lock)

    # --- placing ------------------------------------------------------------------------------

    async def assign(self) -> None:
        """Start an attempt for every queued job that may run now (once at a time: two passes
        at once could both see the same free rung)."""
        async with self._placing:
            for job_id, rung, devices in await asyncio.to_thread(self._placements):
                try:
                    await self._launch(job_id, rung, devices)
                except Exception as exc:  # the provider refused or is away: the job waits
                    said = f"Provider {rung.name} refused the attempt: {exc}"
                    if (job_id, said) not in self._refusals:  # said once, not every poll
                        self._refusals.add((job_id, said))
                        log.warning("job %s: %s", job_id, said)
                        await asyncio.to_thread(self._note, job_id, said)

    def _placements(self) -> list[tuple[str, ProviderSpec, int]]:
        """The queue and the live attempts, read at once; placement.py decides."""
        with session_scope(self.engine) as session:
            queued = session.exec(
                select(JobRow).where(JobRow.status == "queued", col(JobRow.plan).is_not(None))
            ).all()
            live = session.exec(
                select(AttemptRow.job_id, AttemptRow.provider, JobRow.tenant)
                .join(JobRow, col(JobRow.id) == col(AttemptRow.job_id), isouter=True)
                .where(col(AttemptRow.state).in_(LIVE))
            ).all()
            waiting = [QueuedJob.of(row) for row in queued]
        decided = place(
            waiting,
            [LiveAttempt(job_id, provider, tenant or "") for job_id, provider, tenant in live],
            self.pool.ordered(),
            settings=self.settings,
            now=utcnow(),
        )
        return [(p.job_id, p.rung, p.device_count) for p in decided]

    async def _launch(self, job_id: str, rung: ProviderSpec, devices: int) -> None:
        attempt_id = f"attempt-{uuid.uuid4().hex[:12]}"
        job, previous, checkpoints, halvings = await asyncio.to_thread(self._next_attempt, job_id)
        if job.status != "queued":
            return  # paused or cancelled meanwhile
        resume_from = checkpoints[0] if checkpoints else None
        reports = rung.reports_base(self.settings.public_url, self.own_address)
        config = self.trainer_config(
            job, attempt_id, f"{self.output_prefix(job)}/{attempt_id}", reports
        )
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
            resume_fallbacks=tuple(checkpoints[1 : 1 + RESUME_FALLBACKS]),
            env=self.trainer_env,
            device=rung.device,
            device_count=devices,
            max_runtime_s=rung.max_runtime_s,
            command=self.trainer_command,
        )
        handle = await asyncio.to_thread(self.pool.get(rung.name).submit, spec)
        number = (previous.number + 1) if previous is not None else 1
        await asyncio.to_thread(
            self._record, job.id, attempt_id, number, handle, resume_from, halvings, previous,
            rung, devices,
        )  # fmt: skip
        resources = {"device": rung.device, "device_count": devices}
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

    def _next_attempt(self, job_id: str) -> tuple[JobRow, AttemptRow | None, list[str], int]:
        """The job, its latest attempt, its checkpoints to go on from (newest first), and how
        many times the learning rate is halved (once per attempt that ended in a NaN loss)."""
        with session_scope(self.engine) as session:
            job = session.get(JobRow, job_id)
            assert job is not None
            attempts = session.exec(
                select(AttemptRow)
                .where(AttemptRow.job_id == job_id)
                .order_by(col(AttemptRow.number).desc())
            ).all()
            checkpoints = session.exec(
                select(CheckpointRow.uri)
                .where(CheckpointRow.job_id == job_id, col(CheckpointRow.pruned).is_(False))
                .order_by(col(CheckpointRow.step).desc())
                .limit(1 + RESUME_FALLBACKS)
            ).all()
            halvings = sum(1 for a in attempts if a.failure == "nan_loss")
            previous = attempts[0] if attempts else None
            return job, previous, list(checkpoints), halvings

    def _record(
        self,
        job_id: str,
        attempt_id: str,
        number: int,
        handle: Handle,
        resume_from: str | None,
        halvings: int,
        previous: AttemptRow | None,
        rung: ProviderSpec,
        devices: int,
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
                    # What it runs on and at what price, kept: the ladder may change.
                    device=rung.device,
                    device_count=devices,
                    cost_per_hour=rung.cost_per_hour,
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
        limit = await asyncio.to_thread(self._limit_reached, attempt.job_id)
        if limit is not None:
            await asyncio.to_thread(
                self._note, attempt.job_id, f"Stopping: {limit}; {_ENDS_HERE}", "info"
            )
            await self.request_stop(attempt, "budget")
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

    def _limit_reached(self, job_id: str) -> str | None:
        with session_scope(self.engine) as session:
            job = session.get(JobRow, job_id)
            if job is None:
                return None
            return budgets.job_limit_reached(session, self.pool, job)

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
        if ended.stop_requested in FINISHING:
            await self.finish_training(job.id)
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
        """Queue the job for its next attempt, or fail it once it has failed too often; a job
        whose budget is spent ends its training instead."""
        limit = await asyncio.to_thread(self._limit_reached, job.id)
        if limit is not None:
            await asyncio.to_thread(
                self._note,
                job.id,
                f"Attempt {ended.number} ended and {limit}; {_ENDS_HERE}",
                "info",
            )
            await self.finish_training(job.id)
            return
        verdict = ending(ended)
        idle = await asyncio.to_thread(self._idle_rollovers, job.id)
        if idle >= self.settings.max_failed_attempts:
            await self.fail(
                job.id,
                "no_progress",
                f"its last {idle} attempts were rolled over before they trained a step: the "
                f"{ended.provider} provider's max_runtime_s less the rollover lead "
                f"({self.settings.rollover_lead_s:g} s) leaves too little time after the "
                "trainer's start-up",
            )
            return
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

    def _idle_rollovers(self, job_id: str) -> int:
        """Attempts in a row, the latest first, rolled over before they trained a step (one now
        and then is a slow start; every time, a rung too short for this job would go on
        forever)."""
        idle = 0
        with session_scope(self.engine) as session:
            for attempt in session.exec(
                select(AttemptRow)
                .where(AttemptRow.job_id == job_id)
                .order_by(col(AttemptRow.number).desc())
            ):
                if attempt.stop_requested != "rollover" or attempt.last_step is not None:
                    break
                idle += 1
        return idle

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
                level="warn" if verdict.counts else "info",
            )

    def _paused(self, job_id: str, ended: AttemptRow) -> None:
        with session_scope(self.engine) as session:
            jobs.add_event(
                session,
                job_id,
                f"Paused: attempt {ended.number} stopped after step {ended.last_step}; resume "
                "goes on from its checkpoint",
            )

    # --- ending training before its last step ----------------------------------------------------

    async def finish_training(self, job_id: str) -> None:
        """End the job's training at its newest checkpoint (a budget spent, an early stop): the
        evaluator scores what is due up to it and decides, as after a trainer's own last step.
        With no checkpoint there is nothing to keep, and the job fails saying so."""
        found = await asyncio.to_thread(self._finishing, job_id)
        if found == "finished":
            return  # a redelivered early stop, a poll after a restart
        if found is None:
            await self.fail(
                job_id,
                "stopped_before_checkpoint",
                "training was stopped (budget or early stop) before it saved any checkpoint",
            )
            return
        job, attempt, checkpoint = found
        await self.publish(
            TrainingCompleted(
                # One id per attempt: finishing twice (a redelivery, a restart) publishes once.
                event_id=_finish_id(attempt.id),
                tenant=job.tenant,
                job_id=job.id,
                attempt_id=attempt.id,
                artifact_uri=checkpoint.uri,
                last_step=checkpoint.step,
                last_checkpoint_uri=checkpoint.uri,
                trained_tokens=job.trained_tokens,
            )
        )
        # After the publish: a crash in between publishes again (the same id, so once).
        with session_scope(self.engine) as session:
            jobs.add_event(
                session,
                job_id,
                f"Training ended at step {checkpoint.step}; waiting for the final evaluation",
                event_id=_finish_id(attempt.id),
            )

    def _finishing(
        self, job_id: str
    ) -> tuple[JobRow, AttemptRow, CheckpointRow] | Literal["finished"] | None:
        with session_scope(self.engine) as session:
            job = session.get(JobRow, job_id)
            attempt = self.current(session, job_id)
            if attempt is not None and session.get(JobEventRow, _finish_id(attempt.id)) is not None:
                return "finished"
            checkpoint = session.exec(
                select(CheckpointRow)
                .where(CheckpointRow.job_id == job_id, col(CheckpointRow.pruned).is_(False))
                .order_by(col(CheckpointRow.step).desc())
            ).first()
            if job is None or attempt is None or checkpoint is None or job.status in TERMINAL:
                return None
            job.status = "running"  # evaluating what it trained (from queued or paused too)
            tokens = max((a.tokens_last or 0 for a in self._attempts(session, job_id)), default=0)
            job.trained_tokens = tokens or job.trained_tokens
            session.add(job)
            session.commit()
            session.refresh(job)
            return job, attempt, checkpoint

    @staticmethod
    def _attempts(session: Session, job_id: str) -> list[AttemptRow]:
        return list(session.exec(select(AttemptRow).where(AttemptRow.job_id == job_id)).all())

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
            if isinstance(report, StartedReport) and report.trained_tokens is not None:
                current.tokens_start = report.trained_tokens
            tokens = getattr(report, "trained_tokens", None)
            if isinstance(report, ProgressReport | CompletedReport) and tokens is not None:
                current.tokens_last = max(tokens, current.tokens_last or 0)
            if isinstance(report, CompletedReport):
                current.completed = True
            elif isinstance(report, FailedReport) and report.reason != "interrupted":
                current.failure = report.reason
                current.reason = report.message[:1000]
            session.add(current)
            session.commit()
            return True

    def _note(self, job_id: str, message: str, level: EventLevel = "warn") -> None:
        with session_scope(self.engine) as session:
            jobs.add_event(session, job_id, message, level=level)


def _finish_id(attempt_id: str) -> str:
    """The id of the end of training at an attempt's checkpoint: finishing twice (a redelivered
    early stop, a restart) publishes and notes it once."""
    return uuid.uuid5(uuid.NAMESPACE_URL, f"{attempt_id}/finish").hex


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

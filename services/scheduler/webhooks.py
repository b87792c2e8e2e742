"""The trainer's signed reports: verified, then turned into job state and bus events.

Each report is signed with the job's own secret (derived from the service's, planning.py), with
a timestamp and a nonce: a stale or replayed report is refused (401), a malformed one named
(400). The bus event made from a report carries the report's id as its event id and the job
event row is keyed by it, so a report the trainer sends twice changes nothing.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping

from sqlmodel import col, select

from services.scheduler import jobs, planning
from services.scheduler.attempts import PERMANENT_FAILURES
from services.scheduler.jobs import JobError
from services.scheduler.lifecycle import Scheduler
from services.scheduler.models import AttemptRow, CheckpointRow, JobRow
from services.scheduler.protocol import TERMINAL
from shared.db import session_scope, utcnow
from shared.events import CheckpointSaved, JobProgressed, JobStarted, TrainingCompleted
from shared.reports import (
    CheckpointSavedReport,
    CompletedReport,
    FailedReport,
    ProgressReport,
    ReportError,
    StartedReport,
    TrainerReport,
    parse_report,
)
from shared.signing import NonceStore, SignatureError, verify

# A checkpoint's directory (services/trainer/checkpoints.py: CHECKPOINT_DIR_FORMAT).
_STEP_DIR = re.compile(r"step-(\d+)$")
# How much of each skipped checkpoint's error a job event quotes.
_ERROR_CHARS = 300

# The report's fields JobProgressed carries as they are.
_PROGRESS_FIELDS = {
    "attempt_id", "step", "total_steps", "epoch", "loss", "learning_rate", "grad_norm",
    "tokens_per_s", "eta_s",
}  # fmt: skip


class ReportReceiver:
    def __init__(self, scheduler: Scheduler, *, nonces: NonceStore, tolerance_s: float) -> None:
        self.scheduler = scheduler
        self.nonces = nonces
        self.tolerance_s = tolerance_s

    async def receive(self, job_id: str, headers: Mapping[str, str], body: bytes) -> None:
        job = await asyncio.to_thread(self.scheduler.job, job_id)
        master = self.scheduler.settings.webhook_secret.get_secret_value()
        try:
            verify(
                headers,
                body,
                planning.webhook_secret(master, job_id),
                nonce_store=self.nonces,
                tolerance_s=self.tolerance_s,
            )
        except SignatureError as exc:
            raise JobError(401, f"report refused: {exc}", code="invalid_signature") from None
        try:
            report = parse_report(body)
        except ReportError as exc:
            raise JobError(400, str(exc), code="invalid_report") from None
        if report.job_id != job.id or report.tenant != job.tenant:
            raise JobError(
                400, "job_id / tenant: the report is about another job", code="invalid_report"
            )
        if not await asyncio.to_thread(self.scheduler.attempts.take_report, job.id, report):
            # An attempt the job has moved on from (rolled over, recovered): what it still
            # says, a checkpoint above all, must not become the job's.
            raise JobError(
                409,
                f"attempt_id: {report.attempt_id} is not the current attempt of job {job.id}",
                code="stale_attempt",
            )
        await self.apply(job, report)

    async def apply(self, job: JobRow, report: TrainerReport) -> None:
        if isinstance(report, FailedReport):
            # A failure a new attempt would repeat ends the job now; any other is the attempt's,
            # and the poll that sees its trainer exit decides what comes next (attempts.py).
            if report.reason in PERMANENT_FAILURES:
                await self.scheduler.fail(job.id, report.reason, report.message)
            return
        if job.status in TERMINAL:
            return  # a cancelled job's trainer may still be saying goodbye
        if isinstance(report, StartedReport):
            await self._started(job, report)
        elif isinstance(report, ProgressReport):
            await self._progress(job, report)
        elif isinstance(report, CheckpointSavedReport):
            await self._checkpoint(job, report)
        elif isinstance(report, CompletedReport):
            await self._completed(job, report)

    async def _started(self, job: JobRow, report: StartedReport) -> None:
        await self.scheduler.publish(
            JobStarted(
                event_id=report.report_id,
                tenant=job.tenant,
                job_id=job.id,
                attempt_id=report.attempt_id,
                provider=await asyncio.to_thread(self._provider_of, report.attempt_id),
            )
        )

        def record() -> None:
            with session_scope(self.scheduler.engine) as session:
                row = session.get(JobRow, job.id)
                assert row is not None
                if row.status == "queued":
                    row.status, row.started_at = "running", utcnow()
                    session.add(row)
                    session.commit()
                resumed = f", resumed from {report.resumed_from}" if report.resumed_from else ""
                jobs.add_event(
                    session,
                    job.id,
                    f"Training started on {report.device} ({report.total_steps} steps{resumed})",
                    event_id=report.report_id,
                )
                if report.resume_skipped:
                    jobs.add_event(
                        session,
                        job.id,
                        _resume_warning(report),
                        level="warn",
                        data={
                            "resumed_from": report.resumed_from,
                            "resume_skipped": [s.model_dump() for s in report.resume_skipped],
                        },
                        event_id=f"{report.report_id}-resume",
                    )

        await asyncio.to_thread(record)

    def _provider_of(self, attempt_id: str) -> str:
        with session_scope(self.scheduler.engine) as session:
            attempt = session.get(AttemptRow, attempt_id)
            return attempt.provider if attempt is not None else "unknown"

    async def _progress(self, job: JobRow, report: ProgressReport) -> None:
        await self.scheduler.publish(
            JobProgressed(
                event_id=report.report_id,
                tenant=job.tenant,
                job_id=job.id,
                **report.model_dump(include=_PROGRESS_FIELDS),
            )
        )
        await asyncio.to_thread(
            self._note,
            job.id,
            f"Step {report.step}/{report.total_steps}: training loss={report.loss:.4f}",
            report.report_id,
            _metrics(report),
        )

    def _note(
        self, job_id: str, message: str, event_id: str, data: dict[str, float] | None = None
    ) -> None:
        """One job event for a report, keyed by the report's id (a retry writes nothing)."""
        with session_scope(self.scheduler.engine) as session:
            kind = "metrics" if data is not None else "message"
            jobs.add_event(session, job_id, message, type=kind, data=data, event_id=event_id)

    async def _checkpoint(self, job: JobRow, report: CheckpointSavedReport) -> None:
        await self.scheduler.publish(
            CheckpointSaved(
                event_id=report.report_id,
                tenant=job.tenant,
                job_id=job.id,
                attempt_id=report.attempt_id,
                step=report.step,
                uri=report.uri,
                metrics=report.metrics,
            )
        )

        def record() -> None:
            with session_scope(self.scheduler.engine) as session:
                jobs.record_checkpoint(
                    session,
                    job_id=job.id,
                    step=report.step,
                    uri=report.uri,
                    train_loss=report.metrics.get("loss"),
                )
                jobs.add_event(
                    session,
                    job.id,
                    f"Checkpoint saved at step {report.step}",
                    event_id=report.report_id,
                )

        await asyncio.to_thread(record)

    async def _completed(self, job: JobRow, report: CompletedReport) -> None:
        # A trainer of an older release names neither: the newest checkpoint row stands in.
        last = report.last_checkpoint_uri or await asyncio.to_thread(self._last_checkpoint, job.id)
        tokens = report.trained_tokens
        await self.scheduler.publish(
            TrainingCompleted(
                event_id=report.report_id,
                tenant=job.tenant,
                job_id=job.id,
                attempt_id=report.attempt_id,
                artifact_uri=report.artifact_uri,
                last_step=report.steps,
                last_checkpoint_uri=last,
                trained_tokens=int(tokens) if tokens is not None else None,
                metrics=report.metrics,
            )
        )

        def record() -> None:
            with session_scope(self.scheduler.engine) as session:
                row = session.get(JobRow, job.id)
                assert row is not None
                if tokens is not None:
                    row.trained_tokens = int(tokens)
                    session.add(row)
                    session.commit()
                jobs.add_event(
                    session,
                    job.id,
                    f"Training finished after {report.steps} steps; waiting for the final evaluation",
                    event_id=report.report_id,
                )

        await asyncio.to_thread(record)

    def _last_checkpoint(self, job_id: str) -> str | None:
        with session_scope(self.scheduler.engine) as session:
            row = session.exec(
                select(CheckpointRow)
                .where(CheckpointRow.job_id == job_id)
                .order_by(col(CheckpointRow.step).desc())
            ).first()
            return row.uri if row is not None else None


def _resume_warning(report: StartedReport) -> str:
    """The job event for checkpoints the trainer could not resume from (corrupt, uncommitted,
    gone), e.g. "Resumed from step 30 (…/step-00000030), skipping 1 checkpoint it could not use:
    step-00000040 (…/step-00000040/model/adapter_model.safetensors: sha256 …, manifest says …)"."""
    count = len(report.resume_skipped)
    skipped = "; ".join(
        f"{_dir_name(s.uri)} ({s.error[:_ERROR_CHARS]})" for s in report.resume_skipped
    )
    what = f"{count} checkpoint{'s' if count > 1 else ''} it could not use"
    if report.resumed_from is None:
        return f"Started from step 0, skipping {what}: {skipped}"
    step = _STEP_DIR.search(report.resumed_from.rstrip("/"))
    where = f"step {int(step.group(1))} ({report.resumed_from})" if step else report.resumed_from
    return f"Resumed from {where}, skipping {what}: {skipped}"


def _dir_name(uri: str) -> str:
    return uri.rstrip("/").rsplit("/", 1)[-1]


def _metrics(report: ProgressReport) -> dict[str, float]:
    """A step's metrics event's `data`: OpenAI's step, loss and learning rate, and where the run
    stands (total steps, the trainer's ETA) when the report says, so a client can show progress
    without reading the job's plan."""
    data = {"step": report.step, "train_loss": report.loss, "learning_rate": report.learning_rate}
    if report.total_steps is not None:
        data["total_steps"] = report.total_steps
    if report.eta_s is not None:
        data["eta_s"] = round(report.eta_s, 1)
    return data

"""Jobs as rows and as the API shows them: create, read, page, record events and checkpoints.

Pure data access over a sqlmodel Session (no HTTP, no bus), so every state change the
lifecycle makes is tested with plain calls. Errors carry their HTTP status (`JobError`); the
API maps them once.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlmodel import Session, col, select

from services.scheduler.models import CheckpointRow, JobEventRow, JobRow
from services.scheduler.protocol import (
    TERMINAL,
    Checkpoint,
    CheckpointMetrics,
    DecisionOut,
    EventLevel,
    Job,
    JobCreate,
    JobEvent,
    ResolvedHyperparameters,
    checkpoint_name,
)
from services.scheduler.protocol import (
    JobError as ErrorOut,
)
from shared.db import utcnow

MAX_PAGE = 100


class JobError(Exception):
    """A request the jobs API refuses: the status, OpenAI's error code and the field named."""

    def __init__(
        self, status: int, message: str, *, param: str | None = None, code: str = ""
    ) -> None:
        super().__init__(message)
        self.status = status
        self.param = param
        self.code = code or {400: "invalid_request", 404: "not_found", 409: "conflict"}.get(
            status, "invalid_request"
        )


def new_job_id() -> str:
    return f"ftjob-{uuid.uuid4().hex[:24]}"


def _unix(moment: datetime | None) -> int | None:
    return int(moment.timestamp()) if moment is not None else None


def _loads(blob: bytes | None) -> Any:
    return json.loads(blob) if blob else None


def dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), default=str).encode()


def create(
    session: Session, *, job_id: str, tenant: str, request: JobCreate, dataset_id: str | None
) -> JobRow:
    row = JobRow(
        id=job_id,
        tenant=tenant,
        status="validating_files",
        model=request.model,
        training_file=request.training_file,
        validation_file=request.validation_file,
        dataset_id=dataset_id,
        suffix=request.suffix,
        seed=request.seed if request.seed is not None else uuid.uuid4().int % 2**31,
        auto_deploy=request.auto_deploy,
        max_duration_s=request.max_duration_s,
        max_cost=request.max_cost,
        priority=request.priority,
        request=dumps(request.model_dump(mode="json", exclude_none=True)),
    )
    session.add(row)
    session.commit()
    session.refresh(row)
    return row


def get(session: Session, *, tenant: str, job_id: str) -> JobRow:
    """The tenant's job; another tenant's is as absent as a missing one."""
    row = session.get(JobRow, job_id)
    if row is None or row.tenant != tenant:
        raise JobError(404, f"fine-tuning job {job_id!r} not found", param="fine_tuning_job_id")
    return row


def page(
    session: Session, *, tenant: str, after: str | None, limit: int
) -> tuple[list[JobRow], bool]:
    """Newest first; `after` is the last id of the previous page (OpenAI's cursor)."""
    query = select(JobRow).where(JobRow.tenant == tenant)
    if after is not None:
        anchor = get(session, tenant=tenant, job_id=after)
        query = query.where(
            sa.or_(
                col(JobRow.created_at) < anchor.created_at,
                sa.and_(col(JobRow.created_at) == anchor.created_at, col(JobRow.id) < anchor.id),
            )
        )
    query = query.order_by(col(JobRow.created_at).desc(), col(JobRow.id).desc()).limit(limit + 1)
    rows = list(session.exec(query).all())
    return rows[:limit], len(rows) > limit


def add_event(
    session: Session,
    job_id: str,
    message: str,
    *,
    level: EventLevel = "info",
    type: str = "message",
    data: dict[str, Any] | None = None,
    event_id: str | None = None,
) -> None:
    """Record one job event; a bus event's id makes a redelivered one insert nothing."""
    row = JobEventRow(
        id=event_id or uuid.uuid4().hex,
        job_id=job_id,
        level=level,
        type=type,
        message=message[:2000],
        data=dumps(data) if data is not None else None,
    )
    if session.get(JobEventRow, row.id) is None:
        session.add(row)
        session.commit()


def events(
    session: Session, *, job_id: str, after: str | None, limit: int
) -> tuple[list[JobEvent], bool]:
    """Newest first, as OpenAI lists a job's events."""
    query = select(JobEventRow).where(JobEventRow.job_id == job_id)
    if after is not None:
        anchor = session.get(JobEventRow, after)
        if anchor is None or anchor.job_id != job_id:
            raise JobError(400, f"after: {after!r} is not an event of this job", param="after")
        query = query.where(
            sa.or_(
                col(JobEventRow.created_at) < anchor.created_at,
                sa.and_(
                    col(JobEventRow.created_at) == anchor.created_at,
                    col(JobEventRow.id) < anchor.id,
                ),
            )
        )
    query = query.order_by(col(JobEventRow.created_at).desc(), col(JobEventRow.id).desc())
    rows = list(session.exec(query.limit(limit + 1)).all())
    return [_event(r) for r in rows[:limit]], len(rows) > limit


def _event(row: JobEventRow) -> JobEvent:
    return JobEvent(
        id=row.id,
        created_at=_unix(row.created_at) or 0,
        level=row.level,
        message=row.message,
        type=row.type,
        data=_loads(row.data),
    )


def record_checkpoint(
    session: Session, *, job_id: str, step: int, uri: str, train_loss: float | None
) -> bool:
    """Store a saved checkpoint once (by job and step); False when it was known already."""
    known = session.exec(
        select(CheckpointRow).where(CheckpointRow.job_id == job_id, CheckpointRow.step == step)
    ).first()
    if known is not None:
        return False
    session.add(
        CheckpointRow(
            id=f"ftckpt-{uuid.uuid4().hex[:24]}",
            job_id=job_id,
            step=step,
            uri=uri,
            train_loss=train_loss,
        )
    )
    session.commit()
    return True


def checkpoints(
    session: Session, *, job: JobRow, after: str | None, limit: int
) -> tuple[list[Checkpoint], bool]:
    """Newest step first; pruned checkpoints are gone from storage and from the list."""
    query = select(CheckpointRow).where(
        CheckpointRow.job_id == job.id, col(CheckpointRow.pruned).is_(False)
    )
    if after is not None:
        anchor = session.get(CheckpointRow, after)
        if anchor is None or anchor.job_id != job.id:
            raise JobError(400, f"after: {after!r} is not a checkpoint of this job", param="after")
        query = query.where(col(CheckpointRow.step) < anchor.step)
    rows = list(session.exec(query.order_by(col(CheckpointRow.step).desc()).limit(limit + 1)).all())
    name = job.fine_tuned_model or planned_name(job)
    return [_checkpoint(r, job.id, name) for r in rows[:limit]], len(rows) > limit


def _checkpoint(row: CheckpointRow, job_id: str, fine_tuned: str) -> Checkpoint:
    return Checkpoint(
        id=row.id,
        created_at=_unix(row.created_at) or 0,
        fine_tuned_model_checkpoint=checkpoint_name(fine_tuned, row.step),
        fine_tuning_job_id=job_id,
        step_number=row.step,
        metrics=CheckpointMetrics(
            step=row.step, train_loss=row.train_loss, task_score=row.task_score
        ),
    )


def planned_name(job: JobRow) -> str:
    plan = _loads(job.plan) or {}
    return str(plan.get("fine_tuned_model", ""))


def finish(row: JobRow, status: str, *, error: dict[str, Any] | None = None) -> None:
    """Move a job to a terminal status (once: a terminal job stays as it ended)."""
    if row.status in TERMINAL:
        return
    row.status = status
    row.finished_at = utcnow()
    if error is not None:
        row.error = dumps(error)


def to_api(row: JobRow) -> Job:
    request = _loads(row.request) or {}
    plan = _loads(row.plan) or {}
    resolved = plan.get("hyperparameters")
    error = _loads(row.error)
    return Job(
        id=row.id,
        created_at=_unix(row.created_at) or 0,
        finished_at=_unix(row.finished_at),
        model=row.model,
        fine_tuned_model=row.fine_tuned_model,
        organization_id=row.tenant,
        status=row.status,
        hyperparameters=ResolvedHyperparameters(**resolved) if resolved else None,
        method=request.get("method") or {"type": "supervised"},
        training_file=row.training_file,
        validation_file=row.validation_file,
        trained_tokens=row.trained_tokens,
        error=ErrorOut(**error) if error else None,
        seed=row.seed,
        estimated_finish=_unix(row.estimated_finish),
        metadata=request.get("metadata"),
        suffix=row.suffix,
        max_duration_s=row.max_duration_s,
        max_cost=row.max_cost,
        auto_deploy=row.auto_deploy,
        priority=row.priority,
        decisions=[DecisionOut(**d) for d in plan.get("decisions", [])],
        base_score=row.base_score,
        best_step=row.best_step,
        gate=row.gate,
    )

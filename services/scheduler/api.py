"""HTTP routes of the scheduler: OpenAI's fine-tuning jobs API and the trainer's report webhook.

The gateway relays `/v1/fine_tuning/...` here with the caller's key; `/internal/...` is for
the trainer alone (signed reports), is never relayed, and is left out of the OpenAPI document.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response, status
from sqlalchemy.engine import Engine

from services.scheduler import jobs, usage
from services.scheduler.lifecycle import Scheduler
from services.scheduler.protocol import (
    CheckpointList,
    Job,
    JobCreate,
    JobEventList,
    JobList,
    Usage,
)
from services.scheduler.webhooks import ReportReceiver
from shared import auth
from shared.db import get_engine, session_scope

router = APIRouter(prefix="/v1/fine_tuning", tags=["fine-tuning"])
internal = APIRouter(prefix="/internal", include_in_schema=False)
EngineDep = Annotated[Engine, Depends(get_engine)]
Reader = Annotated[auth.Principal, Depends(auth.require_access)]
Limit = Annotated[int, Query(ge=1, le=jobs.MAX_PAGE)]
After = Annotated[str | None, Query(max_length=64)]


async def get_scheduler(request: Request) -> Scheduler:
    scheduler: Scheduler = request.app.state.scheduler
    return scheduler


SchedulerDep = Annotated[Scheduler, Depends(get_scheduler)]
# The headers the caller's key may travel in; passed on to ingest to resolve its training file.
_KEY_HEADERS = ("authorization", "x-api-key", "x-goog-api-key")


@router.post("/jobs", response_model=Job, summary="Create a fine-tuning job")
async def create_job(
    body: JobCreate, request: Request, principal: auth.WriterDep, scheduler: SchedulerDep
) -> Job:
    """OpenAI's request; `max_duration_s` and `auto_deploy` are tuneloop's (SDK: extra_body).
    Every `"auto"` hyperparameter is decided by the recipe, each with its reason in `decisions`."""
    key = {name: value for name in _KEY_HEADERS if (value := request.headers.get(name))}
    row = await scheduler.create(body, tenant=principal.tenant_id, authorization=key)
    return jobs.to_api(row)


@router.get("/jobs", response_model=JobList, summary="List fine-tuning jobs, newest first")
def list_jobs(
    principal: Reader, engine: EngineDep, after: After = None, limit: Limit = 20
) -> JobList:
    with session_scope(engine) as session:
        rows, more = jobs.page(session, tenant=principal.tenant_id, after=after, limit=limit)
        return JobList(data=[jobs.to_api(r) for r in rows], has_more=more)


@router.get("/jobs/{fine_tuning_job_id}", response_model=Job, summary="Retrieve a job")
def get_job(fine_tuning_job_id: str, principal: Reader, engine: EngineDep) -> Job:
    with session_scope(engine) as session:
        return jobs.to_api(jobs.get(session, tenant=principal.tenant_id, job_id=fine_tuning_job_id))


@router.post("/jobs/{fine_tuning_job_id}/cancel", response_model=Job, summary="Cancel a job")
async def cancel_job(
    fine_tuning_job_id: str, principal: auth.WriterDep, scheduler: SchedulerDep
) -> Job:
    """SIGTERM to the trainer (it checkpoints), SIGKILL after the grace period."""
    row = await scheduler.cancel(tenant=principal.tenant_id, job_id=fine_tuning_job_id)
    return jobs.to_api(row)


@router.post("/jobs/{fine_tuning_job_id}/pause", response_model=Job, summary="Pause a job")
async def pause_job(
    fine_tuning_job_id: str, principal: auth.WriterDep, scheduler: SchedulerDep
) -> Job:
    """SIGTERM to the trainer, which checkpoints and exits; `resume` goes on from there. 409
    for a job that is not queued or running."""
    row = await scheduler.pause(tenant=principal.tenant_id, job_id=fine_tuning_job_id)
    return jobs.to_api(row)


@router.post("/jobs/{fine_tuning_job_id}/resume", response_model=Job, summary="Resume a job")
async def resume_job(
    fine_tuning_job_id: str, principal: auth.WriterDep, scheduler: SchedulerDep
) -> Job:
    """A paused job is queued again; its next attempt goes on from its newest checkpoint. 409
    for a job that is not paused."""
    row = await scheduler.resume(tenant=principal.tenant_id, job_id=fine_tuning_job_id)
    return jobs.to_api(row)


@router.get(
    "/jobs/{fine_tuning_job_id}/events", response_model=JobEventList, summary="A job's events"
)
def job_events(
    fine_tuning_job_id: str,
    principal: Reader,
    engine: EngineDep,
    after: After = None,
    limit: Limit = 20,
) -> JobEventList:
    with session_scope(engine) as session:
        jobs.get(session, tenant=principal.tenant_id, job_id=fine_tuning_job_id)
        data, more = jobs.events(session, job_id=fine_tuning_job_id, after=after, limit=limit)
        return JobEventList(data=data, has_more=more)


@router.get(
    "/jobs/{fine_tuning_job_id}/checkpoints",
    response_model=CheckpointList,
    summary="A job's checkpoints, newest step first, with train loss and task score",
)
def job_checkpoints(
    fine_tuning_job_id: str,
    principal: Reader,
    engine: EngineDep,
    after: After = None,
    limit: Limit = 10,
) -> CheckpointList:
    with session_scope(engine) as session:
        job = jobs.get(session, tenant=principal.tenant_id, job_id=fine_tuning_job_id)
        data, more = jobs.checkpoints(session, job=job, after=after, limit=limit)
        return CheckpointList(
            data=data,
            has_more=more,
            first_id=data[0].id if data else None,
            last_id=data[-1].id if data else None,
        )


@router.get("/usage", response_model=Usage, summary="Training used, per provider")
async def training_usage(
    principal: Reader,
    engine: EngineDep,
    scheduler: SchedulerDep,
    since: Annotated[datetime | None, Query(description="attempts started at or after")] = None,
) -> Usage:
    """The caller's attempts per provider: how many, device-hours and cost at the ladder's
    prices (an attempt still running counts up to now)."""
    with session_scope(engine) as session:
        return usage.usage(session, scheduler.pool, tenant=principal.tenant_id, since=since)


@internal.post("/trainer/{job_id}/reports", status_code=status.HTTP_204_NO_CONTENT)
async def trainer_report(job_id: str, request: Request) -> Response:
    """A signed trainer report (shared/reports.py); 401 when unsigned, stale or replayed."""
    receiver: ReportReceiver = request.app.state.reports
    await receiver.receive(job_id, request.headers, await request.body())
    return Response(status_code=status.HTTP_204_NO_CONTENT)

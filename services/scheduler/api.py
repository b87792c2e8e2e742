"""HTTP routes of the scheduler: OpenAI's fine-tuning jobs API and the trainer's report webhook.

The gateway relays `/v1/fine_tuning/...` here with the caller's key; `/internal/...` is for
the trainer alone (signed reports), is never relayed, and is left out of the OpenAPI document.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query, Request, Response, status
from pydantic import BaseModel
from sqlalchemy.engine import Engine

from services.scheduler import budgets, jobs, usage
from services.scheduler.lifecycle import Scheduler
from services.scheduler.protocol import (
    Budget,
    BudgetUpdate,
    CheckpointList,
    Job,
    JobCreate,
    JobEventList,
    JobList,
    RetrainPolicy,
    RetrainPolicyCreate,
    RetrainPolicyList,
    RetrainPolicyUpdate,
    Usage,
)
from services.scheduler.retrain import Retrainer
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


@router.get("/budget", response_model=Budget, summary="This month's training budget")
def get_budget(principal: Reader, engine: EngineDep, scheduler: SchedulerDep) -> Budget:
    """The caller's monthly cap (its own, the platform's, the one that applies), what this
    calendar month (UTC) has cost so far and when it resets."""
    with session_scope(engine) as session:
        return budgets.budget(
            session,
            scheduler.pool,
            tenant=principal.tenant_id,
            platform_cap=scheduler.settings.tenant_monthly_cap,
        )


@router.put("/budget", response_model=Budget, summary="Set this tenant's monthly cap")
def put_budget(
    body: BudgetUpdate,
    principal: Annotated[auth.Principal, Depends(auth.require_scope("admin"))],
    engine: EngineDep,
    scheduler: SchedulerDep,
) -> Budget:
    """An admin key sets (or, with null, removes) the tenant's own cap; past the cap that
    applies, new jobs are refused with 429 until the month ends."""
    with session_scope(engine) as session:
        budgets.set_cap(session, tenant=principal.tenant_id, cap=body.monthly_cost_cap)
        return budgets.budget(
            session,
            scheduler.pool,
            tenant=principal.tenant_id,
            platform_cap=scheduler.settings.tenant_monthly_cap,
        )


async def get_retrainer(request: Request) -> Retrainer:
    retrainer: Retrainer = request.app.state.retrainer
    return retrainer


RetrainerDep = Annotated[Retrainer, Depends(get_retrainer)]
POLICIES = "/retrain_policies"


class PolicyDeleted(BaseModel):
    id: str
    object: Literal["fine_tuning.retrain_policy.deleted"] = "fine_tuning.retrain_policy.deleted"
    deleted: bool = True


@router.post(POLICIES, response_model=RetrainPolicy, summary="Create a retrain policy")
async def create_policy(
    body: RetrainPolicyCreate, principal: auth.WriterDep, retrainer: RetrainerDep
) -> RetrainPolicy:
    """Train the next version from new traffic by itself: `source` (ingest's sample filter) and
    its `cleaning` / `split` are checked by ingest now, the job template like a job's."""
    return await retrainer.create(principal.tenant_id, body)


@router.get(POLICIES, response_model=RetrainPolicyList, summary="The tenant's retrain policies")
def list_policies(principal: Reader, retrainer: RetrainerDep) -> RetrainPolicyList:
    return RetrainPolicyList(data=retrainer.policies(principal.tenant_id))


@router.get(POLICIES + "/{policy_id}", response_model=RetrainPolicy, summary="A retrain policy")
def get_policy(policy_id: str, principal: Reader, retrainer: RetrainerDep) -> RetrainPolicy:
    return retrainer.get(principal.tenant_id, policy_id)


@router.post(
    POLICIES + "/{policy_id}", response_model=RetrainPolicy, summary="Update a retrain policy"
)
def update_policy(
    policy_id: str, body: RetrainPolicyUpdate, principal: auth.WriterDep, retrainer: RetrainerDep
) -> RetrainPolicy:
    """Enable or disable it, change its trigger or `auto_deploy`."""
    return retrainer.update(principal.tenant_id, policy_id, body)


@router.delete(
    POLICIES + "/{policy_id}", response_model=PolicyDeleted, summary="Delete a retrain policy"
)
def delete_policy(
    policy_id: str, principal: auth.WriterDep, retrainer: RetrainerDep
) -> PolicyDeleted:
    """The datasets and jobs it started stay."""
    retrainer.delete(principal.tenant_id, policy_id)
    return PolicyDeleted(id=policy_id)


@router.post(
    POLICIES + "/{policy_id}/run", response_model=RetrainPolicy, summary="Run a policy now"
)
async def run_policy(
    policy_id: str, principal: auth.WriterDep, retrainer: RetrainerDep
) -> RetrainPolicy:
    """Whatever its trigger says; 409 while the job of its last run has not ended."""
    return await retrainer.run_now(principal.tenant_id, policy_id)


@internal.post("/trainer/{job_id}/reports", status_code=status.HTTP_204_NO_CONTENT)
async def trainer_report(job_id: str, request: Request) -> Response:
    """A signed trainer report (shared/reports.py); 401 when unsigned, stale or replayed."""
    receiver: ReportReceiver = request.app.state.reports
    await receiver.receive(job_id, request.headers, await request.body())
    return Response(status_code=status.HTTP_204_NO_CONTENT)

"""HTTP routes of the evaluator service: a tenant's read-only view of its jobs' evaluations.

`GET /v1/evals/{job_id}`: the base score, each checkpoint's mean task score, the best step and
the decision with its gate. `GET /v1/evals/{job_id}/points/{step}/items`: each item of the
subset at one point (`base` for the base model) with its input, output, score and latency.
The gateway relays /v1/evals/* here. Another tenant's job is 404, as one that does not exist.
"""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from sqlalchemy.engine import Engine

from services.evaluator import decision, records
from services.evaluator.evals import protocol as evals_protocol
from services.evaluator.evals import serving as evals_serving
from services.evaluator.models import BASE_STEP, EvalJobRow
from shared import auth
from shared.db import get_engine

router = APIRouter(prefix="/v1", tags=["evals"], dependencies=[Depends(auth.require_access)])
EngineDep = Annotated[Engine, Depends(get_engine)]


class EvalError(Exception):
    """A request this service cannot answer; `status` is its HTTP status (mapped once, below)."""

    status = 400


class EvalNotFound(EvalError, LookupError):
    status = 404


class BadStep(EvalError, ValueError):
    status = 422


async def eval_error_response(_: Request, exc: Exception) -> JSONResponse:
    status = exc.status if isinstance(exc, EvalError) else 500
    return JSONResponse({"detail": str(exc)}, status_code=status)


class Point(BaseModel):
    step: int
    checkpoint_uri: str
    task_score: float | None = Field(description="mean task score; null until scored")
    status: Literal["scored", "pending", "not_due"]
    duration_s: float | None = None
    outputs_uri: str | None = None
    train_loss: float | None = Field(default=None, description="mean since the checkpoint before")
    judge_errors: int = Field(
        default=0,
        description="answers the judge could not grade (judge_error), left out of task_score",
    )


class Decided(BaseModel):
    best_step: int
    best_checkpoint_uri: str
    best_score: float | None
    base_score: float | None
    scores: dict[int, float]
    gate: Literal["passed", "rejected"] | None
    gate_reason: str
    rescored: dict[int, float] = Field(
        default_factory=dict, description="the top checkpoints' scores on the whole eval split"
    )
    rescored_items: int | None = None
    serving_version_id: str | None = Field(
        default=None, description="the version serving the job's served name when it was decided"
    )
    serving_score: float | None = Field(
        default=None, description="that version's score on the items best_score was measured on"
    )
    serving_items: int | None = None
    beats_serving: bool | None = Field(
        default=None, description="null: nothing served the name, or the job does not auto-deploy"
    )


class EvalObject(BaseModel):
    object: Literal["evaluation"] = "evaluation"
    job_id: str
    task_kind: str
    base_model: str
    dataset_id: str
    dataset_version: str
    eval_every: int
    sample_count: int
    status: Literal["planned", "scoring", "decided", "ended"]
    error: str | None = None
    base_score: float | None
    base_judge_errors: int = Field(default=0, description="the base's answers with no verdict")
    points: list[Point]
    best_step: int | None
    best_score: float | None
    decision: Decided | None
    gate: Literal["passed", "rejected"] | None
    gate_reason: str | None
    early_stop_reason: str | None = Field(
        default=None, description="why the evaluator asked to end training early (overfitting)"
    )


class ItemResult(BaseModel):
    position: int
    sample_id: str
    input: dict[str, Any] = Field(description="the prompt sent: OpenAI messages and tools")
    reference: dict[str, Any]
    output: dict[str, Any] = Field(description="the model's text and tool calls")
    score: float
    detail: dict[str, Any]
    latency_ms: float
    error: str | None


class ItemList(BaseModel):
    object: Literal["list"] = "list"
    job_id: str
    step: int | Literal["base"]
    data: list[ItemResult]


def _job(engine: Engine, tenant: str, job_id: str) -> EvalJobRow:
    job = records.get_job(engine, job_id)
    if job is None or job.tenant != tenant:
        raise EvalNotFound(f"job_id: no evaluation of job {job_id!r}")
    return job


def _status(job: EvalJobRow) -> Literal["planned", "scoring", "decided", "ended"]:
    if job.decision_published:
        return "decided"
    if job.closed:
        return "ended"
    return "scoring" if job.base_score is not None else "planned"


def _evaluation(engine: Engine, tenant: str, job_id: str) -> EvalObject:
    job = _job(engine, tenant, job_id)
    last = job.last_step if job.last_step is not None else job.steps
    unjudged = records.judge_errors(engine, job_id)
    points = []
    for p in records.points(engine, job_id):
        due = decision.is_due(p.step, eval_every=job.eval_every, last_step=last)
        state: Literal["scored", "pending", "not_due"] = (
            "scored" if p.score is not None else "pending" if due else "not_due"
        )
        points.append(
            Point(
                step=p.step,
                checkpoint_uri=p.checkpoint_uri,
                task_score=p.score,
                status=state,
                duration_s=p.duration_s,
                outputs_uri=p.outputs_uri,
                train_loss=p.train_loss,
                judge_errors=unjudged.get(p.step, 0) if p.score is not None else 0,
            )
        )
    best = decision.best_of({p.step: p.task_score for p in points if p.task_score is not None})
    decided = Decided(**json.loads(job.decision)) if job.decision else None
    return EvalObject(
        job_id=job.job_id,
        task_kind=job.task_kind,
        base_model=job.base_model,
        dataset_id=job.dataset_id,
        dataset_version=job.dataset_version,
        eval_every=job.eval_every,
        sample_count=len(records.items(engine, job_id)),
        status=_status(job),
        error=job.eval_error,
        base_score=job.base_score,
        base_judge_errors=unjudged.get(BASE_STEP, 0),
        points=points,
        best_step=decided.best_step if decided else best[0] if best else None,
        best_score=decided.best_score if decided else best[1] if best else None,
        decision=decided,
        gate=decided.gate if decided else None,
        gate_reason=decided.gate_reason if decided else None,
        early_stop_reason=job.early_stop_reason,
    )


def _step(step: str) -> int:
    if step == "base":
        return BASE_STEP
    if step.isdigit():
        return int(step)
    raise BadStep(f"step: {step!r} is neither a checkpoint step (an integer >= 0) nor 'base'")


def _items(engine: Engine, tenant: str, job_id: str, step: str) -> ItemList:
    number = _step(step)
    _job(engine, tenant, job_id)
    rows = records.results(engine, job_id, number)
    if not rows:
        raise EvalNotFound(f"step: job {job_id!r} has no scored point at step {step!r}")
    data = [
        ItemResult(
            position=item.position,
            sample_id=item.sample_id,
            input=json.loads(item.prompt),
            reference=json.loads(item.reference),
            output={"text": result.output, "tool_calls": json.loads(result.tool_calls)},
            score=result.score,
            detail=json.loads(result.detail),
            latency_ms=result.latency_ms,
            error=result.error,
        )
        for item, result in rows
    ]
    return ItemList(job_id=job_id, step="base" if number == BASE_STEP else number, data=data)


Principal = Annotated[auth.Principal, Depends(auth.require_access)]


@router.get(
    "/evals/{job_id}",
    response_model=EvalObject | evals_protocol.Eval,
    summary="A job's evaluation: base score, each checkpoint's task score, best step, gate; "
    "for an `eval_...` id, that eval of the Evals API (services/evaluator/evals)",
)
async def get_evaluation(
    job_id: str, principal: Principal, engine: EngineDep
) -> EvalObject | evals_protocol.Eval:
    if evals_serving.is_eval_id(job_id):
        return await asyncio.to_thread(
            evals_serving.eval_by_id, engine, principal.tenant_id, job_id
        )
    return await asyncio.to_thread(_evaluation, engine, principal.tenant_id, job_id)


@router.get(
    "/evals/{job_id}/points/{step}/items",
    response_model=ItemList,
    summary="Each eval item at one point ('base' or a step): input, output, score, latency",
)
async def get_point_items(
    job_id: str, step: str, principal: Principal, engine: EngineDep
) -> ItemList:
    return await asyncio.to_thread(_items, engine, principal.tenant_id, job_id, step)

"""HTTP routes of the judge: a dataset version's rubric (read, list, edit), people's labels on a
job's answers, and the judge's view of a job (its verdicts, and how far the labels agree).

- `GET /v1/evals/rubrics/{dataset_version}` (`?version=N` for an older one), `.../versions`;
  `PUT` the same path with a rubric stores it as the next version (later scores name it).
- `PUT /v1/evals/{job_id}/points/{step}/items/{position}/label` {score in [0, 1] | passed,
  note?}, `DELETE` it; `GET /v1/evals/{job_id}/labels`.
- `GET /v1/evals/{job_id}/judge`: per point the judge's and the deterministic mean, verdicts
  and judge_errors; the calibration (Kendall's tau-b, its 95 % interval, labels, exact agreement,
  trusted / untrusted / not enough labels).
Tenant-scoped like the rest of /v1/evals: another tenant's job or rubric is 404.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query, Request, Response
from pydantic import BaseModel, Field, model_validator
from sqlalchemy.engine import Engine

from services.evaluator import judge_records, records
from services.evaluator.api import EvalNotFound, _job, _step
from services.evaluator.judging import Calibration, Judging
from services.evaluator.models import BASE_STEP, JudgeLabelRow, JudgeRubricRow
from services.evaluator.rubric import Rubric
from shared import auth
from shared.db import get_engine

router = APIRouter(prefix="/v1", tags=["evals"], dependencies=[Depends(auth.require_access)])
EngineDep = Annotated[Engine, Depends(get_engine)]
Principal = Annotated[auth.Principal, Depends(auth.require_access)]
TRUSTED_WHEN = "Kendall's tau-b >= 0.6 on >= 10 labelled answers, with variation on both sides"


def _judging(request: Request, engine: EngineDep) -> Judging:
    """The app's Judging (app.py); without one, a judge-less view of the same tables."""
    found = getattr(request.app.state, "judging", None)
    return found if isinstance(found, Judging) else Judging(db=engine, client=None, model=None)


JudgingDep = Annotated[Judging, Depends(_judging)]


class RubricObject(BaseModel):
    object: Literal["evaluation.rubric"] = "evaluation.rubric"
    dataset_version: str
    version: int
    source: Literal["generated", "default", "user"] = Field(
        description="written by the judge, the default template (see note), or a user's edit"
    )
    note: str | None
    judge_model: str | None
    created_at: datetime
    rubric: Rubric

    @classmethod
    def of(cls, row: JudgeRubricRow) -> RubricObject:
        return cls(
            dataset_version=row.dataset_version,
            version=row.version,
            source=row.source,
            note=row.note,
            judge_model=row.judge_model,
            created_at=row.created_at,
            rubric=judge_records.rubric_of(row),
        )


class RubricList(BaseModel):
    object: Literal["list"] = "list"
    dataset_version: str
    data: list[RubricObject]


class LabelIn(BaseModel):
    score: float | None = Field(default=None, ge=0, le=1, description="a score in [0, 1]")
    passed: bool | None = Field(default=None, description="pass/fail instead of a score")
    note: str | None = Field(default=None, max_length=2000)

    @model_validator(mode="after")
    def _one_verdict(self) -> LabelIn:
        if (self.score is None) == (self.passed is None):
            raise ValueError("score: give either a score in [0, 1] or passed (true/false)")
        return self


class LabelObject(BaseModel):
    object: Literal["evaluation.label"] = "evaluation.label"
    job_id: str
    step: int | Literal["base"]
    position: int
    dataset_version: str
    kind: Literal["score", "pass_fail"]
    score: float
    passed: bool | None
    note: str | None
    updated_at: datetime

    @classmethod
    def of(cls, row: JudgeLabelRow) -> LabelObject:
        return cls(
            job_id=row.job_id,
            step="base" if row.step == BASE_STEP else row.step,
            position=row.position,
            dataset_version=row.dataset_version,
            kind=row.kind,
            score=row.score,
            passed=row.score >= 0.5 if row.kind == "pass_fail" else None,
            note=row.note,
            updated_at=row.updated_at,
        )


class LabelList(BaseModel):
    object: Literal["list"] = "list"
    job_id: str
    data: list[LabelObject]


class PointJudged(BaseModel):
    step: int | Literal["base"]
    judge_score: float | None = Field(description="mean over the answers with a verdict")
    deterministic_score: float
    verdicts: int
    judge_errors: int = Field(description="answers the judge gave no readable verdict on")
    rubric_versions: list[str]


class CalibrationObject(BaseModel):
    status: Literal["trusted", "untrusted", "not enough labels"]
    labels: int = Field(description="labelled answers with a judge verdict")
    kendall_tau: float | None
    tau_ci95: tuple[float, float] | None
    exact_agreement: float | None
    reason: str
    rubric_version: str | None
    judge_model: str | None
    unjudged: int = Field(description="labels whose answer has no verdict")
    trusted_when: str = TRUSTED_WHEN

    @classmethod
    def of(cls, calibration: Calibration) -> CalibrationObject:
        a = calibration.agreement
        return cls(
            status=a.status,
            labels=a.labels,
            kendall_tau=a.kendall_tau,
            tau_ci95=a.tau_ci95,
            exact_agreement=a.exact_agreement,
            reason=a.reason,
            rubric_version=calibration.rubric_version,
            judge_model=calibration.judge_model,
            unjudged=calibration.unjudged,
        )


class JudgeView(BaseModel):
    object: Literal["evaluation.judge"] = "evaluation.judge"
    job_id: str
    judged: bool
    reason: str | None = Field(default=None, description="why the judge does not grade this job")
    model: str | None
    dataset_version: str
    points: list[PointJudged]
    calibration: CalibrationObject | None


# --- rubrics -------------------------------------------------------------------------------------


def _rubric(
    engine: Engine, tenant: str, dataset_version: str, version: int | None
) -> JudgeRubricRow:
    if version is None:
        row = judge_records.latest_rubric(engine, tenant, dataset_version)
    else:
        row = judge_records.get_rubric(engine, tenant, dataset_version, version)
    if row is None:
        which = "a rubric" if version is None else f"rubric version {version}"
        raise EvalNotFound(f"dataset_version: {dataset_version!r} has no {which}")
    return row


@router.get(
    "/evals/rubrics/{dataset_version}",
    response_model=RubricObject,
    summary="A dataset version's rubric: the latest, or ?version=N",
)
async def get_rubric(
    dataset_version: str,
    principal: Principal,
    engine: EngineDep,
    version: Annotated[int | None, Query(ge=1)] = None,
) -> RubricObject:
    row = await asyncio.to_thread(_rubric, engine, principal.tenant_id, dataset_version, version)
    return RubricObject.of(row)


@router.get(
    "/evals/rubrics/{dataset_version}/versions",
    response_model=RubricList,
    summary="Every version of a dataset version's rubric, oldest first",
)
async def list_rubrics(dataset_version: str, principal: Principal, engine: EngineDep) -> RubricList:
    rows = await asyncio.to_thread(
        judge_records.rubric_versions, engine, principal.tenant_id, dataset_version
    )
    return RubricList(dataset_version=dataset_version, data=[RubricObject.of(r) for r in rows])


@router.put(
    "/evals/rubrics/{dataset_version}",
    response_model=RubricObject,
    summary="Edit a dataset version's rubric: stored as its next version",
)
async def put_rubric(
    dataset_version: str, body: Rubric, principal: Principal, engine: EngineDep
) -> RubricObject:
    def store() -> JudgeRubricRow:
        latest = judge_records.latest_rubric(engine, principal.tenant_id, dataset_version)
        return judge_records.add_rubric(
            engine,
            tenant=principal.tenant_id,
            dataset_version=dataset_version,
            rubric=body,
            source="user",
            after=latest.version if latest is not None else None,
        )

    return RubricObject.of(await asyncio.to_thread(store))


# --- labels --------------------------------------------------------------------------------------


def _label(
    engine: Engine, tenant: str, job_id: str, step: str, position: int, body: LabelIn
) -> JudgeLabelRow:
    job = _job(engine, tenant, job_id)
    number = _step(step)
    if not any(r.position == position for _, r in records.results(engine, job_id, number)):
        raise EvalNotFound(f"position: job {job_id!r} has no answer {position} at step {step!r}")
    passed = body.passed
    return judge_records.put_label(
        engine,
        tenant=tenant,
        dataset_version=job.dataset_version,
        job_id=job_id,
        step=number,
        position=position,
        kind="pass_fail" if passed is not None else "score",
        score=float(passed) if passed is not None else float(body.score or 0.0),
        note=body.note,
    )


@router.put(
    "/evals/{job_id}/points/{step}/items/{position}/label",
    response_model=LabelObject,
    summary="Label one answer (a score in [0, 1], or passed): what the judge is checked against",
)
async def put_label(
    job_id: str, step: str, position: int, body: LabelIn, principal: Principal, engine: EngineDep
) -> LabelObject:
    row = await asyncio.to_thread(_label, engine, principal.tenant_id, job_id, step, position, body)
    return LabelObject.of(row)


@router.delete(
    "/evals/{job_id}/points/{step}/items/{position}/label",
    status_code=204,
    response_class=Response,
    summary="Remove a label",
)
async def delete_label(
    job_id: str, step: str, position: int, principal: Principal, engine: EngineDep
) -> Response:
    def remove() -> None:
        _job(engine, principal.tenant_id, job_id)
        if not judge_records.delete_label(engine, job_id, _step(step), position):
            raise EvalNotFound(f"position: no label on answer {position} at step {step!r}")

    await asyncio.to_thread(remove)
    return Response(status_code=204)


@router.get("/evals/{job_id}/labels", response_model=LabelList, summary="A job's labels")
async def list_labels(job_id: str, principal: Principal, engine: EngineDep) -> LabelList:
    def read() -> list[JudgeLabelRow]:
        _job(engine, principal.tenant_id, job_id)
        return judge_records.labels_of_job(engine, job_id)

    rows = await asyncio.to_thread(read)
    return LabelList(job_id=job_id, data=[LabelObject.of(r) for r in rows])


# --- the judge's view of a job -------------------------------------------------------------------


@router.get(
    "/evals/{job_id}/judge",
    response_model=JudgeView,
    summary="The judge on a job: verdicts per point, and its agreement with people's labels",
)
async def get_judge_view(
    job_id: str, principal: Principal, engine: EngineDep, judging: JudgingDep
) -> JudgeView:
    job = await asyncio.to_thread(_job, engine, principal.tenant_id, job_id)
    judged = await asyncio.to_thread(judge_records.judged_job, engine, job_id)
    steps = [
        p.step
        for p in await asyncio.to_thread(records.points, engine, job_id)
        if p.score is not None
    ]
    points = await judging.points(job_id, [BASE_STEP, *steps])
    calibration = await judging.calibration(job.tenant, job.dataset_version) if judged else None
    return JudgeView(
        job_id=job_id,
        judged=judged is not None,
        reason=None
        if judged
        else (
            f"no judge was configured when the job was planned, or its task kind "
            f"({job.task_kind}) is not one the judge grades (TUNELOOP_EVALUATOR_JUDGE_KINDS)"
        ),
        model=judged.model if judged else None,
        dataset_version=job.dataset_version,
        points=[
            PointJudged(
                step="base" if p.step == BASE_STEP else p.step,
                judge_score=p.judge_score,
                deterministic_score=p.deterministic_score,
                verdicts=p.verdicts,
                judge_errors=p.judge_errors,
                rubric_versions=p.rubric_versions,
            )
            for p in points.values()
        ],
        calibration=CalibrationObject.of(calibration) if calibration else None,
    )

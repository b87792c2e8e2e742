"""HTTP route of the shadow scorer: `GET /v1/shadow_scores/{served_name}` (relayed by the
gateway), a served name's shadow judged against its primary, per pair of versions scored.
Tenant-scoped: another tenant's name is a 404, as an unknown one."""

from __future__ import annotations

import asyncio
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, Field
from sqlalchemy.engine import Engine

from services.evaluator import shadow_store as store
from services.evaluator.api import EvalNotFound
from services.evaluator.shadow import ShadowScorer, pairwise_score
from shared import auth
from shared.db import get_engine
from shared.events import PairwiseScore

router = APIRouter(prefix="/v1", tags=["shadow"], dependencies=[Depends(auth.require_access)])
EngineDep = Annotated[Engine, Depends(get_engine)]
Principal = Annotated[auth.Principal, Depends(auth.require_access)]


class ShadowScore(BaseModel):
    primary_version: str
    shadow_version: str
    current: bool = Field(description="these are the name's primary and shadow now")
    score: PairwiseScore


class ShadowScores(BaseModel):
    object: Literal["shadow_scores"] = "shadow_scores"
    name: str
    judge: Literal["configured", "not configured"] = Field(
        description="without a judge (TUNELOOP_EVALUATOR_JUDGE_*) nothing is scored"
    )
    judge_model: str | None
    min_pairs: int = Field(description="decided pairs needed before a verdict")
    primary_version: str | None = Field(description="the name's primary now")
    shadow_version: str | None = Field(description="the name's shadow now (null: none)")
    data: list[ShadowScore] = Field(description="newest judged first")


def _scorer(request: Request) -> ShadowScorer:
    found: ShadowScorer = request.app.state.shadow
    return found


def _scores(engine: Engine, scorer: ShadowScorer, tenant: str, name: str) -> ShadowScores:
    target = store.target(engine, tenant, name)
    tallies = store.tallies(engine, tenant, name)
    if target is None and not tallies:
        raise EvalNotFound(f"served_name: no served name {name!r}")
    now = (target.primary_version, target.shadow_version) if target else (None, None)
    data = [
        ShadowScore(
            primary_version=tally.primary_version,
            shadow_version=tally.shadow_version,
            current=(tally.primary_version, tally.shadow_version) == now,
            score=pairwise_score(tally, scorer.min_pairs),
        )
        for tally in tallies
    ]
    return ShadowScores(
        name=name,
        judge="configured" if scorer.configured else "not configured",
        judge_model=scorer.model if scorer.configured else None,
        min_pairs=scorer.min_pairs,
        primary_version=now[0],
        shadow_version=now[1],
        data=data,
    )


@router.get(
    "/shadow_scores/{served_name}",
    response_model=ShadowScores,
    summary="A served name's shadow judged pairwise against its primary on mirrored calls",
)
async def shadow_scores(
    served_name: str, principal: Principal, engine: EngineDep, request: Request
) -> ShadowScores:
    scorer = _scorer(request)
    return await asyncio.to_thread(_scores, engine, scorer, principal.tenant_id, served_name)

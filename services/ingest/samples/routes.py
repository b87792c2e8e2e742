"""HTTP routes of samples: list (filtered, a page at a time), get one, and the fidelity report
(samples made, and what was rejected or dropped, by reason)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import BaseModel, RootModel

from services.ingest.http.deps import EngineDep, IngestDep
from services.ingest.http.errors import NotFound
from services.ingest.samples import store as samples
from shared import auth
from shared.chat import Sample
from shared.db import session_scope

router = APIRouter(tags=["samples"])


class SamplePage(BaseModel):
    object: str = "list"
    data: list[dict[str, Any]]
    next_cursor: str | None = None
    has_more: bool


class SourceFidelity(BaseModel):
    samples: int
    rejected: dict[str, int]
    dropped: dict[str, int]


class FidelityReport(RootModel[dict[str, SourceFidelity]]):
    """Per source (gateway, upload, otlp): samples made, calls or lines rejected and what the
    samples do not carry, each by reason."""


@router.get("/v1/samples", response_model=SamplePage)
def list_samples(
    principal: auth.PrincipalDep, engine: EngineDep, query: Annotated[samples.SampleQuery, Query()]
) -> SamplePage:
    with session_scope(engine) as session:
        page, cursor = samples.list_samples(session, tenant=principal.tenant_id, query=query)
    return SamplePage(
        data=[s.model_dump(mode="json", exclude_none=True) for s in page],
        next_cursor=cursor,
        has_more=cursor is not None,
    )


@router.get("/v1/samples/{sample_id}", response_model=Sample, response_model_exclude_none=True)
def get_sample(sample_id: str, principal: auth.PrincipalDep, engine: EngineDep) -> Sample:
    with session_scope(engine) as session:
        sample = samples.get_sample(session, tenant=principal.tenant_id, sample_id=sample_id)
    if sample is None:
        raise NotFound(f"sample {sample_id!r} not found")
    return sample


@router.get(
    "/v1/ingest/fidelity",
    response_model=FidelityReport,
    summary="Samples made, and what was rejected or dropped, by reason",
)
async def fidelity(principal: auth.PrincipalDep, ingest: IngestDep) -> FidelityReport:
    """Totals over every ingest process since the first start, per source."""
    return FidelityReport.model_validate(await ingest.fidelity.report(principal.tenant_id))

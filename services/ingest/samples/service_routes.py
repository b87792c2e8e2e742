"""Routes for the platform's other services, acting for a tenant (the service token, never a
tenant's key): the scheduler's retrain policies count new traffic and build datasets from it;
the evaluator reads the shadow pairs the gateway captured, to score them against each other.

Under `/internal/tenants/{tenant}/...`: the tenant is named in the path because the caller holds
no key of it; the service token is what is checked (shared.auth.require_service). Left out of
the OpenAPI document, as every `/internal` route is.
"""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query
from pydantic import AwareDatetime, BaseModel, ConfigDict

from services.ingest.datasets import select as dataset_select
from services.ingest.datasets.routes import (
    Dataset,
    WorkerDep,
    check_base_model,
    dataset_row,
    start_build,
)
from services.ingest.datasets.spec import DatasetSpec, SampleFilter
from services.ingest.http.deps import EngineDep
from services.ingest.samples import shadow_pairs
from shared import auth
from shared.db import session_scope
from shared.tenancy import TENANT_PATTERN

Tenant = Annotated[str, Path(pattern=TENANT_PATTERN)]
router = APIRouter(
    prefix="/internal/tenants/{tenant}",
    include_in_schema=False,
    dependencies=[Depends(auth.require_service)],
)


class SampleCount(BaseModel):
    model_config = ConfigDict(extra="forbid")

    source: SampleFilter = SampleFilter()
    # Only samples captured at or after it (with the filter's own `since`, the later counts).
    since: AwareDatetime | None = None


class Counted(BaseModel):
    count: int


@router.post("/samples/count", response_model=Counted)
def count_samples(tenant: Tenant, body: SampleCount, engine: EngineDep) -> Counted:
    """How many of the tenant's samples the filter selects (an upper bound where it names
    models or metadata, as for a dataset's selection)."""
    selection = body.source
    if body.since is not None and (selection.since is None or selection.since < body.since):
        selection = selection.model_copy(update={"since": body.since})
    with session_scope(engine) as session:
        return Counted(
            count=dataset_select.count_filtered(session, tenant=tenant, selection=selection)
        )


@router.post("/datasets", status_code=202, response_model=Dataset)
async def build_dataset(
    tenant: Tenant, spec: DatasetSpec, engine: EngineDep, worker: WorkerDep
) -> Dataset:
    """`POST /v1/datasets` for the tenant: the same checks, the same build."""
    return await start_build(spec, tenant=tenant, engine=engine, worker=worker)


@router.post("/datasets/validate", response_model=Counted)
def validate_dataset(
    tenant: Tenant, spec: DatasetSpec, engine: EngineDep, worker: WorkerDep
) -> Counted:
    """The spec's fields and base model checked as a build would check them (422 naming the
    field), without building: a retrain policy is checked when it is made, long before it first
    runs. `count`: the samples its source selects today."""
    check_base_model(spec, tenant=tenant, bucket=worker.store.bucket)
    with session_scope(engine) as session:
        return Counted(
            count=dataset_select.count_filtered(session, tenant=tenant, selection=spec.source)
        )


@router.get("/datasets/{dataset_id}", response_model=Dataset)
async def dataset(tenant: Tenant, dataset_id: str, engine: EngineDep) -> Dataset:
    row = await asyncio.to_thread(dataset_row, engine, tenant, dataset_id)
    return Dataset.of(row)


@router.get("/shadow_pairs", response_model=shadow_pairs.ShadowPairPage)
def list_shadow_pairs(
    tenant: Tenant,
    engine: EngineDep,
    after: Annotated[str | None, Query(max_length=512)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> shadow_pairs.ShadowPairPage:
    """The tenant's shadow pairs (a served name's answer and its shadow's to the same call)
    stored after the cursor `after`, oldest first (services/ingest/samples/shadow_pairs.py)."""
    with session_scope(engine) as session:
        return shadow_pairs.list_pairs(session, tenant=tenant, after=after, limit=limit)

"""HTTP routes of datasets: create (a background build), read, list, export as OpenAI JSONL.

What can be checked when the request arrives is checked then, so a bad request gets a 4xx
naming the problem instead of a dataset that fails a moment later: the spec's fields, the
base model (a catalogue id prepared here or the tenant's own S3 prefix), the files and eval
files (this tenant's, processed), an empty selection (a COUNT), an eval size that is not
smaller than the selection. The rest (metadata filters, what cleaning leaves) ends the build
`failed` with the reason on the dataset.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request, status
from fastapi.responses import FileResponse
from pydantic import BaseModel, Field
from sqlalchemy.engine import Engine
from sqlmodel import Session
from starlette.background import BackgroundTask

from services.ingest.datasets import rows as dataset_rows
from services.ingest.datasets import select as dataset_select
from services.ingest.datasets import snapshots
from services.ingest.datasets.spec import DatasetSpec
from services.ingest.datasets.workers import DatasetWorker
from services.ingest.http.deps import EngineDep
from services.ingest.http.errors import Conflict, NotFound, Unavailable, Unprocessable
from services.ingest.models import DatasetRow
from shared import auth, catalogue
from shared.catalogue import CatalogueError
from shared.chat import ExportError
from shared.db import session_scope
from shared.events import DatasetBuildRequested
from shared.settings import get_settings

log = logging.getLogger("tuneloop.ingest.datasets")
router = APIRouter(tags=["datasets"])


async def get_worker(request: Request) -> DatasetWorker:
    worker: DatasetWorker = request.app.state.datasets
    return worker


WorkerDep = Annotated[DatasetWorker, Depends(get_worker)]


class Dataset(BaseModel):
    """A dataset as the API shows it (OpenAI-like: id, object, times in unix seconds)."""

    id: str
    object: Literal["dataset"] = "dataset"
    name: str
    base_model: str | None
    status: str = Field(description="queued, building, built or failed")
    created_at: int | None
    started_at: int | None
    finished_at: int | None
    attempts: int
    progress: dict[str, Any] | None
    version: str | None
    uri: str | None
    train_count: int | None
    eval_count: int | None
    stats: dict[str, Any] | None
    report: dict[str, Any] | None
    error: str | None
    spec: dict[str, Any]

    @classmethod
    def of(cls, row: DatasetRow) -> Dataset:
        return cls.model_validate(dataset_rows.dataset_object(row))


class DatasetList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Dataset]
    first_id: str | None
    last_id: str | None
    has_more: bool


def _eval_size(spec: DatasetSpec) -> int | None:
    """An eval size given as a count of samples (a fraction cannot be too big up front)."""
    size = getattr(spec.split, "eval_size", None)
    return size if isinstance(size, int) and not isinstance(size, bool) else None


def check_base_model(spec: DatasetSpec, *, tenant: str, bucket: str) -> None:
    """A catalogue id prepared here, or an s3:// prefix of the tenant's own; 422 otherwise (a
    path or another bucket would let a tenant read whatever the service can)."""
    if spec.base_model is None:
        return
    try:
        catalogue.check_base_model(spec.base_model, tenant=tenant, bucket=bucket)
        catalogue.locate(spec.base_model, data_dir=get_settings().app.data_dir)
    except CatalogueError as exc:
        raise Unprocessable(str(exc)) from None


def check_selection(session: Session, *, tenant: str, spec: DatasetSpec) -> int:
    """How many samples the spec selects, as far as SQL knows; Unprocessable when none or when
    the eval size cannot fit (dataset_select's errors for files unknown, not ready or unfit)."""
    files = dataset_select.check_files(
        session, tenant=tenant, file_ids=spec.file_ids, field_name="file_ids"
    )
    eval_files = dataset_select.check_files(
        session, tenant=tenant, file_ids=spec.eval_file_ids, field_name="eval_file_ids"
    )
    if eval_files and not sum(f.samples for f in eval_files):
        raise Unprocessable("eval_file_ids: the eval files hold no samples")
    selected = sum(f.samples for f in files)
    if spec.source is not None:
        selected += dataset_select.count_filtered(session, tenant=tenant, selection=spec.source)
    if selected == 0:
        where = "source filter" if spec.source is not None else "file_ids"
        raise Unprocessable(f"empty selection: no samples match the {where}")
    size = _eval_size(spec)
    if size is not None and size >= selected:
        raise Unprocessable(
            f"split.eval_size: {size} is not smaller than the {selected} samples selected"
        )
    return selected


@router.post(
    "/v1/datasets",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=Dataset,
    summary="Build a dataset from captured samples or uploaded files (in the background)",
)
async def create_dataset(
    spec: DatasetSpec, principal: auth.WriterDep, engine: EngineDep, worker: WorkerDep
) -> Dataset:
    return await start_build(spec, tenant=principal.tenant_id, engine=engine, worker=worker)


async def start_build(
    spec: DatasetSpec, *, tenant: str, engine: Engine, worker: DatasetWorker
) -> Dataset:
    """Check what can be checked now (an IngestError naming the problem), record the dataset
    and ask for its build; the dataset object, `queued`."""
    check_base_model(spec, tenant=tenant, bucket=worker.store.bucket)

    def create() -> DatasetRow:
        with session_scope(engine) as session:
            check_selection(session, tenant=tenant, spec=spec)
            return dataset_rows.create(
                session,
                tenant=tenant,
                name=spec.name,
                base_model=spec.base_model,
                spec=spec.model_dump(mode="json"),
            )

    row = await asyncio.to_thread(create)
    event = DatasetBuildRequested(
        tenant=tenant, dataset_id=row.id, spec=spec.model_dump(mode="json")
    )
    try:
        await worker.publish(event)
    except Exception as exc:
        # Not on the bus, nobody would build it: take the row back rather than leave it queued.
        log.warning("dataset %s: build request not published: %s", row.id, exc)
        await asyncio.to_thread(dataset_rows.delete, engine, row.id)
        raise Unavailable("the event bus is unavailable; retry") from None
    return Dataset.of(row)


def dataset_row(engine: Engine, tenant: str, dataset_id: str) -> DatasetRow:
    with session_scope(engine) as session:
        row = dataset_rows.get(session, tenant=tenant, dataset_id=dataset_id)
    if row is None:
        raise NotFound(f"dataset {dataset_id!r} not found")
    return row


@router.get(
    "/v1/datasets/{dataset_id}",
    response_model=Dataset,
    summary="A dataset: status, progress, report, stats",
)
def get_dataset(dataset_id: str, principal: auth.PrincipalDep, engine: EngineDep) -> Dataset:
    return Dataset.of(dataset_row(engine, principal.tenant_id, dataset_id))


@router.get(
    "/v1/datasets", response_model=DatasetList, summary="The tenant's datasets, newest first"
)
def list_datasets(
    principal: auth.PrincipalDep,
    engine: EngineDep,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    after: Annotated[str | None, Query(description="id of the last dataset seen")] = None,
) -> DatasetList:
    with session_scope(engine) as session:
        rows, more = dataset_rows.list_page(
            session, tenant=principal.tenant_id, limit=limit, after=after
        )
    return DatasetList(
        data=[Dataset.of(row) for row in rows],
        first_id=rows[0].id if rows else None,
        last_id=rows[-1].id if rows else None,
        has_more=more,
    )


@router.get(
    "/v1/datasets/{dataset_id}/export",
    summary="The built dataset as an OpenAI chat fine-tuning JSONL file",
    response_class=FileResponse,
)
def export_dataset(
    dataset_id: str,
    principal: auth.PrincipalDep,
    engine: EngineDep,
    worker: WorkerDep,
    split: Literal["train", "eval"] = "train",
) -> FileResponse:
    row = dataset_row(engine, principal.tenant_id, dataset_id)
    if row.status != "built" or row.uri is None:
        raise Conflict(f"dataset {dataset_id!r} is {row.status}, not built")
    # Converted to a file before the first byte goes out, a line at a time: memory stays flat,
    # and a sample OpenAI's format cannot express is a 422 naming it, not a file cut short.
    work = Path(tempfile.mkdtemp(prefix="dataset-export-"))
    try:
        snapshots.export_split_to_file(worker.store, row.uri, split, work / "export.jsonl")
    except ExportError as exc:
        shutil.rmtree(work, ignore_errors=True)
        raise Unprocessable(f"dataset {dataset_id!r} cannot be exported: {exc}") from None
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return FileResponse(
        work / "export.jsonl",
        media_type="application/jsonl",
        filename=f"{row.id}-{split}.jsonl",
        background=BackgroundTask(shutil.rmtree, work, ignore_errors=True),
    )

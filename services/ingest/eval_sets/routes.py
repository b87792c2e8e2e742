"""HTTP routes of eval sets: create, read, list, refresh (a new version), a version's content.

A write key creates and refreshes; a read key reads. Everything is the caller's tenant's: another
tenant's eval set is a 404 like an unknown one. A version's content is OpenAI chat fine-tuning
JSONL, the format `GET /v1/datasets/{id}/export` gives, so the Evals API reads an eval set as it
reads a dataset's eval split.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter, Path, Query, status
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, field_validator

from services.ingest.datasets.routes import WorkerDep
from services.ingest.datasets.snapshots import openai_line
from services.ingest.datasets.spec import SampleFilter
from services.ingest.eval_sets import refresh as eval_set_refresh
from services.ingest.eval_sets import store as eval_sets
from services.ingest.http.deps import EngineDep
from services.ingest.models import EvalSetRow, EvalSetVersionRow
from shared import auth
from shared.db import session_scope

router = APIRouter(tags=["eval sets"])
VersionRef = Annotated[
    str,
    Path(
        pattern=r"^(latest|[1-9][0-9]{0,8})$",
        description="a version number (1, 2, ...) or `latest`",
    ),
]
_METADATA_KEYS, _KEY_CHARS, _VALUE_CHARS = 16, 64, 512


class EvalSetIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=200)
    source: SampleFilter = Field(description="which captured samples, as a dataset's `source`")
    size: int = Field(
        default=eval_sets.DEFAULT_SIZE,
        ge=1,
        le=eval_sets.MAX_SIZE,
        description="how many of the most recent selected samples a refresh holds",
    )
    metadata: dict[str, str] | None = Field(
        default=None, description="up to 16 string pairs (keys 64, values 512 characters)"
    )

    @field_validator("metadata")
    @classmethod
    def _metadata(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is None:
            return None
        if len(value) > _METADATA_KEYS:
            raise ValueError(f"at most {_METADATA_KEYS} keys, got {len(value)}")
        for key, text in value.items():
            if not 1 <= len(key) <= _KEY_CHARS:
                raise ValueError(f"key {key[:80]!r}: 1 to {_KEY_CHARS} characters")
            if len(text) > _VALUE_CHARS:
                raise ValueError(f"{key}: at most {_VALUE_CHARS} characters")
        return value


class EvalSet(BaseModel):
    id: str
    object: Literal["eval_set"] = "eval_set"
    name: str
    source: dict[str, Any]
    size: int
    metadata: dict[str, str] | None
    latest_version: int | None = Field(description="null until the first refresh")
    created_at: int = Field(description="unix seconds")
    refreshed_at: int | None

    @classmethod
    def of(cls, row: EvalSetRow) -> EvalSet:
        return cls(
            id=row.id,
            name=row.name,
            source=orjson.loads(row.source),
            size=row.size,
            metadata=orjson.loads(row.meta) if row.meta is not None else None,
            latest_version=row.latest_version or None,
            created_at=int(row.created_at.timestamp()),
            refreshed_at=int(row.refreshed_at.timestamp()) if row.refreshed_at else None,
        )


class EvalSetVersion(BaseModel):
    object: Literal["eval_set.version"] = "eval_set.version"
    eval_set_id: str
    version: int
    item_count: int
    created_at: int = Field(description="unix seconds")
    report: dict[str, Any] = Field(
        description="scanned, removed (by reason), beyond_size, new_items (not in the previous "
        "version), pii, train_datasets, oldest_sample_at, newest_sample_at"
    )

    @classmethod
    def of(cls, row: EvalSetVersionRow) -> EvalSetVersion:
        return cls(
            eval_set_id=row.eval_set_id,
            version=row.version,
            item_count=row.item_count,
            created_at=int(row.created_at.timestamp()),
            report=orjson.loads(row.report),
        )


class EvalSetList(BaseModel):
    object: Literal["list"] = "list"
    data: list[EvalSet]
    first_id: str | None
    last_id: str | None
    has_more: bool


class EvalSetVersionList(BaseModel):
    object: Literal["list"] = "list"
    data: list[EvalSetVersion]


@router.post(
    "/v1/eval_sets",
    status_code=status.HTTP_201_CREATED,
    response_model=EvalSet,
    summary="Create an eval set (its first version comes from a refresh)",
)
def create_eval_set(body: EvalSetIn, principal: auth.WriterDep, engine: EngineDep) -> EvalSet:
    with session_scope(engine) as session:
        row = eval_sets.create(
            session,
            tenant=principal.tenant_id,
            name=body.name,
            source=body.source.model_dump(mode="json"),
            size=body.size,
            metadata=body.metadata,
        )
    return EvalSet.of(row)


@router.get("/v1/eval_sets", response_model=EvalSetList, summary="The tenant's eval sets")
def list_eval_sets(
    principal: auth.PrincipalDep,
    engine: EngineDep,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    after: Annotated[str | None, Query(description="id of the last eval set seen")] = None,
) -> EvalSetList:
    with session_scope(engine) as session:
        rows, more = eval_sets.list_page(
            session, tenant=principal.tenant_id, limit=limit, after=after
        )
    return EvalSetList(
        data=[EvalSet.of(row) for row in rows],
        first_id=rows[0].id if rows else None,
        last_id=rows[-1].id if rows else None,
        has_more=more,
    )


@router.get("/v1/eval_sets/{eval_set_id}", response_model=EvalSet, summary="An eval set")
def get_eval_set(eval_set_id: str, principal: auth.PrincipalDep, engine: EngineDep) -> EvalSet:
    with session_scope(engine) as session:
        return EvalSet.of(
            eval_sets.get(session, tenant=principal.tenant_id, eval_set_id=eval_set_id)
        )


@router.post(
    "/v1/eval_sets/{eval_set_id}/refresh",
    status_code=status.HTTP_201_CREATED,
    response_model=EvalSetVersion,
    summary="A new version: the most recent samples the filter selects, none in a train split",
)
async def refresh_eval_set(
    eval_set_id: str, principal: auth.WriterDep, engine: EngineDep, worker: WorkerDep
) -> EvalSetVersion:
    # Reads the built train splits (the dataset worker's store) and up to a few thousand
    # samples: off the event loop.
    row = await asyncio.to_thread(
        eval_set_refresh.refresh,
        engine,
        worker.store,
        tenant=principal.tenant_id,
        eval_set_id=eval_set_id,
    )
    return EvalSetVersion.of(row)


@router.get(
    "/v1/eval_sets/{eval_set_id}/versions",
    response_model=EvalSetVersionList,
    summary="An eval set's versions, newest first",
)
def list_versions(
    eval_set_id: str, principal: auth.PrincipalDep, engine: EngineDep
) -> EvalSetVersionList:
    with session_scope(engine) as session:
        row = eval_sets.get(session, tenant=principal.tenant_id, eval_set_id=eval_set_id)
        return EvalSetVersionList(
            data=[EvalSetVersion.of(v) for v in eval_sets.versions(session, row)]
        )


@router.get(
    "/v1/eval_sets/{eval_set_id}/versions/{version}",
    response_model=EvalSetVersion,
    summary="One version of an eval set",
)
def get_version(
    eval_set_id: str, version: VersionRef, principal: auth.PrincipalDep, engine: EngineDep
) -> EvalSetVersion:
    with session_scope(engine) as session:
        row = eval_sets.get(session, tenant=principal.tenant_id, eval_set_id=eval_set_id)
        return EvalSetVersion.of(eval_sets.version(session, row, version))


@router.get(
    "/v1/eval_sets/{eval_set_id}/versions/{version}/content",
    response_class=Response,
    summary="A version's samples as OpenAI chat fine-tuning JSONL (what the Evals API reads)",
)
def version_content(
    eval_set_id: str, version: VersionRef, principal: auth.PrincipalDep, engine: EngineDep
) -> Response:
    with session_scope(engine) as session:
        row = eval_sets.get(session, tenant=principal.tenant_id, eval_set_id=eval_set_id)
        chosen = eval_sets.version(session, row, version)
        samples = eval_sets.items(session, chosen)
    # At most MAX_SIZE samples, each checked to be exportable when the version was made.
    body = b"".join(openai_line(sample) for sample in samples)
    return Response(
        body,
        media_type="application/jsonl",
        headers={"x-tuneloop-eval-set-version": str(chosen.version)},
    )

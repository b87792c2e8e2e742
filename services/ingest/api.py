"""HTTP routes of the ingest service: samples, uploads, admin, relays to the control plane, and
the documentation of the provider-compatible gateway and the OTLP receiver, whose routes are
generated from their one table (proxy_routes.py) and served ahead of FastAPI (fastpath.py)."""

from __future__ import annotations

import asyncio
import inspect
import os
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Annotated, Any, BinaryIO
from urllib.parse import quote

import sqlalchemy as sa
from fastapi import APIRouter, Depends, HTTPException, Query, Request, status
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, Field
from sqlalchemy.engine import Engine
from sqlmodel import col, select
from starlette.datastructures import FormData
from starlette.datastructures import UploadFile as StarletteUploadFile
from starlette.types import Message, Receive, Scope, Send

from services.ingest.datasets import routes as dataset_api
from services.ingest.eval_sets import routes as eval_sets_api
from services.ingest.gateway import forwarding
from services.ingest.gateway.routes import ROUTES, ProxyRoute
from services.ingest.models import UploadedFile
from services.ingest.runtime import Ingest
from services.ingest.samples import service_routes as service_api
from services.ingest.samples import store as samples
from services.ingest.samples.feedback import routes as feedback_routes
from services.ingest.tenants import keys as keys_api
from services.ingest.uploads import files as uploads
from services.ingest.uploads.formats import UnknownFormat, check_format
from shared import auth
from shared.body_guard import reads_own_body
from shared.db import get_engine, session_scope
from shared.storage import ObjectNotFound

router = APIRouter()
# Datasets have their own module of routes (dataset_api.py).
router.include_router(dataset_api.router)
# Eval sets, held-out samples refreshed from recent traffic: eval_sets_api.py.
router.include_router(eval_sets_api.router)
# A tenant's own keys (admin scope): keys_api.py.
router.include_router(keys_api.router)
# Feedback on samples (the gateway names each captured call's sample): feedback/routes.py.
router.include_router(feedback_routes.router)
# For the platform's other services, acting for a tenant with the service token: service_api.py.
router.include_router(service_api.router)


async def get_ingest(request: Request) -> Ingest:
    # async: a plain `def` dependency would cost a thread-pool round trip per request.
    ingest: Ingest = request.app.state.ingest
    return ingest


IngestDep = Annotated[Ingest, Depends(get_ingest)]
EngineDep = Annotated[Engine, Depends(get_engine)]

# --- gateway and OTLP traces -------------------------------------------------------------------
# Their documentation, generated from the one route table (proxy_routes.py). ProxyRoutes answers
# these calls before FastAPI routes anything; reached all the same (an app without it in front),
# a route hands the call to the same ProxyEndpoints, so it is served and counted the same way.


class _Asgi(Response):
    """A route's answer that hands the connection to a raw ASGI endpoint."""

    def __init__(self, endpoint: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        super().__init__()
        self._endpoint = endpoint

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._endpoint(scope, receive, send)


def _proxied(route: ProxyRoute) -> Callable[..., Awaitable[Response]]:
    """The endpoint of the FastAPI route that documents one entry of the table."""

    @reads_own_body  # the gateway checks the key, then reads the body under a limit of its own
    async def proxied(request: Request, **path_params: str) -> Response:
        return _Asgi(request.app.state.proxy_endpoints)

    # The template's parameters, declared as FastAPI would for `def f(model: str, ...)`.
    template_params = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=str)
        for name in route.params
    ]
    request = inspect.Parameter("request", inspect.Parameter.KEYWORD_ONLY, annotation=Request)
    proxied.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [*template_params, request], return_annotation=Response
    )
    proxied.__name__ = route.name
    proxied.__doc__ = route.description or None
    return proxied


for _route in ROUTES.routes:
    router.add_api_route(
        _route.template,
        _proxied(_route),
        methods=[_route.method],
        tags=["otlp" if _route.family == "otlp" else "gateway"],
        summary=_route.summary,
    )


# --- uploads ----------------------------------------------------------------------------------


async def _principal(request: Request, ingest: Ingest) -> auth.Principal:
    """The caller, whose key's scope allows the method (a read key only reads: 403)."""
    try:
        principal = await ingest.gateway.authenticate(request)
        action = f"{request.method} {request.url.path}"
        return auth.check_scope(principal, *auth.scopes_for_method(request.method), action=action)
    except auth.AuthError as exc:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, detail=str(exc)) from None
    except auth.ScopeError as exc:
        raise auth.forbidden(exc) from None


# /v1/files takes its form by hand, not as FastAPI File/Form parameters: FastAPI reads and spools
# a multipart body before any dependency runs, so the key would be checked only after a caller
# without one had filled the disk. This is the form as FastAPI would have documented it.
_UPLOAD_FORM = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file", "purpose"],
                    "properties": {
                        "file": {
                            "type": "string",
                            "format": "binary",
                            "description": "JSONL, one sample per line",
                        },
                        "purpose": {"type": "string", "enum": list(uploads.PURPOSES)},
                        "format": {
                            "type": "string",
                            "default": "auto",
                            "description": "auto, or one of the upload formats",
                        },
                    },
                }
            }
        },
    }
}


class _TooLarge(Exception):
    pass


async def _upload_form(request: Request, limit: int) -> FormData:
    """The multipart form, read only now (after the key was checked) and cut off past `limit`
    bytes (413), whether or not the request declared its length."""
    received = 0

    async def receive() -> Message:
        nonlocal received
        message = await request.receive()
        received += len(message.get("body", b""))
        if received > limit:
            raise _TooLarge
        return message

    declared = request.headers.get("content-length", "")
    try:
        if declared.isdigit() and int(declared) > limit:
            raise _TooLarge
        return await Request(request.scope, receive).form(max_files=1, max_fields=8)
    except _TooLarge:
        detail = f"file: the body is over the upload limit of {limit} bytes"
        raise HTTPException(status.HTTP_413_CONTENT_TOO_LARGE, detail=detail) from None


def _form_text(form: FormData, name: str, default: str | None = None) -> str:
    value = form.get(name, default)
    if value is None:
        raise HTTPException(400, detail=f"{name}: required form field is missing")
    if not isinstance(value, str):
        raise HTTPException(400, detail=f"{name}: must be a text field, not a file")
    return value


@router.post(
    "/v1/files",
    tags=["uploads"],
    status_code=200,
    summary="Upload a JSONL file (OpenAI files API)",
    openapi_extra=_UPLOAD_FORM,
)
@reads_own_body
async def upload_file(request: Request, ingest: IngestDep) -> dict[str, Any]:
    principal = await _principal(request, ingest)
    form = await _upload_form(request, ingest.settings.max_upload_bytes)
    try:
        return await _store_upload_form(ingest, principal, form)
    finally:
        await form.close()


async def _store_upload_form(
    ingest: Ingest, principal: auth.Principal, form: FormData
) -> dict[str, Any]:
    file = form.get("file")
    if not isinstance(file, StarletteUploadFile):
        raise HTTPException(400, detail="file: required, as a file part of the form")
    purpose = _form_text(form, "purpose")
    format = _form_text(form, "format", "auto")
    if purpose not in uploads.PURPOSES:
        raise HTTPException(
            400, detail=f"purpose: {purpose!r} is not one of {', '.join(uploads.PURPOSES)}"
        )
    try:
        check_format(format)
    except UnknownFormat as exc:
        raise HTTPException(400, detail=f"format: {exc}") from None
    file_id = uploads.new_file_id()
    size = await asyncio.to_thread(
        uploads.store_upload,
        ingest.store,
        file.file,
        tenant=principal.tenant_id,
        file_id=file_id,
        spool_dir=ingest.spool_dir,
    )
    owner = uploads.new_lease_owner()
    row = UploadedFile(
        id=file_id,
        tenant=principal.tenant_id,
        filename=file.filename or "upload.jsonl",
        purpose=purpose,
        bytes=size,
        format=format,
        **uploads.first_lease(owner, lease_s=ingest.settings.upload_lease_s),
    )
    with session_scope(ingest.engine) as session:
        session.add(row)
        session.commit()
        session.refresh(row)
    ingest.process_in_background(row, leased_to=owner)
    return uploads.file_object(row)


def _file_row(engine: Engine, tenant: str, file_id: str) -> UploadedFile:
    with session_scope(engine) as session:
        row = session.get(UploadedFile, file_id)
    if row is None or row.tenant != tenant:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"file {file_id!r} not found")
    return row


@router.get("/v1/files/{file_id}", tags=["uploads"])
def get_file(file_id: str, principal: auth.PrincipalDep, engine: EngineDep) -> dict[str, Any]:
    return uploads.file_object(_file_row(engine, principal.tenant_id, file_id))


async def _owned_file(request: Request, ingest: Ingest, file_id: str) -> UploadedFile:
    """The caller's file by id; another tenant's is as absent as a missing one (404)."""
    principal = await _principal(request, ingest)
    return await asyncio.to_thread(_file_row, ingest.engine, principal.tenant_id, file_id)


@router.get(
    "/v1/files/{file_id}/content",
    tags=["uploads"],
    summary="The file as uploaded",
    response_class=StreamingResponse,
)
async def file_content(file_id: str, request: Request, ingest: IngestDep) -> StreamingResponse:
    row = await _owned_file(request, ingest, file_id)
    key = uploads.file_key(row.tenant, row.id)
    return await _download(ingest, key, f"file {file_id!r} not found", filename=row.filename)


@router.get(
    "/v1/files/{file_id}/errors",
    tags=["uploads"],
    summary="Every rejected line of a processed file (JSONL)",
    response_class=StreamingResponse,
)
async def file_errors(file_id: str, request: Request, ingest: IngestDep) -> StreamingResponse:
    row = await _owned_file(request, ingest, file_id)
    if row.status != "processed":
        raise HTTPException(
            status.HTTP_409_CONFLICT,
            detail=f"file {file_id!r} is {row.status}: its rejected lines are known once processed",
        )
    key = uploads.file_errors_key(row.tenant, row.id)
    return await _download(ingest, key, f"file {file_id!r} has no list of rejected lines")


@router.delete("/v1/files/{file_id}", tags=["uploads"], summary="Delete a file")
async def delete_file(file_id: str, request: Request, ingest: IngestDep) -> dict[str, Any]:
    """The file, its list of rejected lines and its row go; samples made from it stay."""
    row = await _owned_file(request, ingest, file_id)
    for key in (uploads.file_key(row.tenant, row.id), uploads.file_errors_key(row.tenant, row.id)):
        await asyncio.to_thread(ingest.store.delete, key)
    await asyncio.to_thread(_delete_row, ingest.engine, row.id)
    return {"id": row.id, "object": "file", "deleted": True}


def _delete_row(engine: Engine, file_id: str) -> None:
    with session_scope(engine) as session:
        session.execute(sa.delete(UploadedFile).where(col(UploadedFile.id) == file_id))
        session.commit()


async def _download(
    ingest: Ingest, key: str, missing: str, *, filename: str | None = None
) -> StreamingResponse:
    """An object of the store as a streamed JSONL response, from a local copy (the store's
    client is blocking; the copy keeps a large object out of memory). The copy is unlinked as
    soon as it is open, so it goes however the response ends, a dropped client included."""
    local = ingest.spool_dir / f"{os.getpid()}.{uuid.uuid4().hex}.upload"
    try:
        await asyncio.to_thread(ingest.store.get_file, key, local)
    except ObjectNotFound:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=missing) from None
    handle = local.open("rb")
    local.unlink()
    headers = {"content-length": str(os.fstat(handle.fileno()).st_size)}
    if filename:
        headers["content-disposition"] = f"attachment; filename*=utf-8''{quote(filename)}"
    return StreamingResponse(_read_all(handle), media_type="application/jsonl", headers=headers)


def _read_all(handle: BinaryIO) -> Iterator[bytes]:
    """The file's bytes in 1 MiB chunks (Starlette reads a plain iterator in a thread)."""
    with handle:
        while chunk := handle.read(1 << 20):
            yield chunk


@router.get("/v1/files", tags=["uploads"])
def list_files(principal: auth.PrincipalDep, engine: EngineDep) -> dict[str, Any]:
    with session_scope(engine) as session:
        rows = session.exec(
            select(UploadedFile)
            .where(UploadedFile.tenant == principal.tenant_id)
            .order_by(col(UploadedFile.created_at).desc())
        ).all()
    return {"object": "list", "data": [uploads.file_object(row) for row in rows]}


@router.post(
    "/v1/samples/import", tags=["uploads"], summary="Import JSONL samples from the request body"
)
@reads_own_body
async def import_samples(
    request: Request,
    ingest: IngestDep,
    format: str = "auto",
    import_id: Annotated[str | None, Query(max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")] = None,
) -> dict[str, Any]:
    """The body is read as it arrives. Re-sending with the same `import_id` stores nothing twice."""
    principal = await _principal(request, ingest)
    try:
        check_format(format)
    except UnknownFormat as exc:
        raise HTTPException(400, detail=f"format: {exc}") from None
    file_id = import_id or f"import-{uuid.uuid4().hex[:24]}"
    errors_key = uploads.import_errors_key(principal.tenant_id, file_id)
    with uploads.rejection_log(ingest.spool_dir) as rejections:
        report = await uploads.import_lines(
            ingest.pipeline,
            request.stream(),
            tenant=principal.tenant_id,
            file_id=file_id,
            format=format,
            rejections=rejections,
        )
        if await uploads.store_rejections(rejections, ingest.store, errors_key):
            report.errors_url = f"/v1/samples/imports/{file_id}/errors"
    return {"import_id": file_id, **report.to_dict()}


@router.get(
    "/v1/samples/imports/{import_id}/errors",
    tags=["uploads"],
    summary="Every rejected line of a streamed import (JSONL)",
    response_class=StreamingResponse,
)
async def import_errors(import_id: str, request: Request, ingest: IngestDep) -> StreamingResponse:
    principal = await _principal(request, ingest)
    key = uploads.import_errors_key(principal.tenant_id, import_id)
    return await _download(ingest, key, f"import {import_id!r} not found")


# --- samples ----------------------------------------------------------------------------------


class SamplePage(BaseModel):
    object: str = "list"
    data: list[dict[str, Any]]
    next_cursor: str | None = None
    has_more: bool


@router.get("/v1/samples", tags=["samples"], response_model=SamplePage)
def list_samples(
    principal: auth.PrincipalDep, engine: EngineDep, query: Annotated[samples.SampleQuery, Query()]
) -> SamplePage:
    try:
        with session_scope(engine) as session:
            page, cursor = samples.list_samples(session, tenant=principal.tenant_id, query=query)
    except samples.BadCursor as exc:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, detail=str(exc)) from None
    return SamplePage(
        data=[s.model_dump(mode="json", exclude_none=True) for s in page],
        next_cursor=cursor,
        has_more=cursor is not None,
    )


@router.get("/v1/samples/{sample_id}", tags=["samples"])
def get_sample(sample_id: str, principal: auth.PrincipalDep, engine: EngineDep) -> dict[str, Any]:
    with session_scope(engine) as session:
        sample = samples.get_sample(session, tenant=principal.tenant_id, sample_id=sample_id)
    if sample is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"sample {sample_id!r} not found")
    return sample.model_dump(mode="json", exclude_none=True)


@router.get(
    "/v1/ingest/fidelity",
    tags=["samples"],
    summary="Samples made, and what was rejected or dropped, by reason",
)
async def fidelity(principal: auth.PrincipalDep, ingest: IngestDep) -> dict[str, Any]:
    """Totals over every ingest process since the first start, per source."""
    return await ingest.fidelity.report(principal.tenant_id)


# --- admin ------------------------------------------------------------------------------------


class TenantIn(BaseModel):
    id: str = Field(description="slug: lowercase letters, digits, - or _")
    name: str


@router.post(
    "/v1/admin/tenants", tags=["admin"], status_code=201, dependencies=[Depends(auth.require_admin)]
)
def create_tenant(body: TenantIn, engine: EngineDep) -> dict[str, str]:
    try:
        with session_scope(engine) as session:
            tenant = auth.create_tenant(session, tenant_id=body.id, name=body.name)
            return {"id": tenant.id, "name": tenant.name}
    except auth.AuthInputError as exc:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail=str(exc)) from None
    except auth.TenantExistsError as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, detail=str(exc)) from None


@router.post(
    "/v1/admin/tenants/{tenant_id}/api_keys",
    tags=["admin"],
    status_code=201,
    response_model=keys_api.IssuedKey,
    dependencies=[Depends(auth.require_admin)],
)
def issue_key(tenant_id: str, body: keys_api.KeyIn, engine: EngineDep) -> keys_api.IssuedKey:
    """The key is shown once; only its hash is stored. `scope` defaults to write."""
    return keys_api.issue(engine, tenant_id=tenant_id, body=body)


# --- control plane of other services ----------------------------------------------------------


Forward = Callable[[Request, Ingest], Awaitable[Response]]


def _forwarder(prefix: str, service: str) -> Forward:
    async def forward(request: Request, ingest: IngestDep) -> Response:
        if request.method not in ("GET", "HEAD"):
            # The owner checks every call too; a read key's changes stop here, early.
            await _principal(request, ingest)
        return await forwarding.relay(
            ingest.control_client, request, ingest.services[service], service
        )

    forward.__name__ = f"forward_{prefix}"
    forward.__doc__ = f"Relayed to the {service} service."
    return forward


def _nested_forwarder(prefix: str, service: str) -> Any:
    """`_forwarder` for `/v1/<prefix>/{rest:path}`: `rest` is in the signature so that the
    OpenAPI document declares the path parameter (the relay sends the raw path on)."""
    forward = _forwarder(prefix, service)

    async def forward_nested(rest: str, request: Request, ingest: IngestDep) -> Response:
        return await forward(request, ingest)

    forward_nested.__name__ = f"forward_{prefix}_nested"
    forward_nested.__doc__ = forward.__doc__
    return forward_nested


_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]
for _prefix, _service in forwarding.OWNERS.items():
    for _path, _forward in (
        (f"/v1/{_prefix}", _forwarder(_prefix, _service)),
        (f"/v1/{_prefix}/{{rest:path}}", _nested_forwarder(_prefix, _service)),
    ):
        # A route per method: FastAPI names a many-method route's operations after one of its
        # methods, so they would share one OpenAPI operation id.
        for _method in _METHODS:
            router.add_api_route(_path, _forward, methods=[_method], tags=[f"{_service} (relayed)"])

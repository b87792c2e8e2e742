"""HTTP routes of uploads: OpenAI's files API (`/v1/files`: upload, read, list, delete, the file
and its rejected lines) and the streamed import (`POST /v1/samples/import`).

Both read their own body, after the key was checked (http.deps.principal): FastAPI would read and
spool a body before any dependency runs, so a caller without a key could fill the disk.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from typing import Annotated, BinaryIO
from urllib.parse import quote

import sqlalchemy as sa
from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse
from sqlalchemy.engine import Engine
from sqlmodel import col, select
from starlette.datastructures import FormData
from starlette.datastructures import UploadFile as StarletteUploadFile
from starlette.types import Message

from services.ingest.http.deps import EngineDep, IngestDep, principal
from services.ingest.http.errors import BadRequest, Conflict, NotFound, TooLarge
from services.ingest.models import UploadedFile
from services.ingest.runtime import Ingest
from services.ingest.uploads import files as uploads
from services.ingest.uploads import leases
from services.ingest.uploads.formats import check_format
from services.ingest.uploads.protocol import FileDeleted, FileList, FileObject, ImportResult
from shared import auth
from shared.body_guard import reads_own_body
from shared.db import session_scope
from shared.storage import ObjectNotFound

router = APIRouter(tags=["uploads"])

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


async def _upload_form(request: Request, limit: int) -> FormData:
    """The multipart form, read only now (after the key was checked) and cut off past `limit`
    bytes (413), whether or not the request declared its length."""
    received = 0
    too_large = f"file: the body is over the upload limit of {limit} bytes"

    async def receive() -> Message:
        nonlocal received
        message = await request.receive()
        received += len(message.get("body", b""))
        if received > limit:
            raise TooLarge(too_large)
        return message

    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise TooLarge(too_large)
    return await Request(request.scope, receive).form(max_files=1, max_fields=8)


def _form_text(form: FormData, name: str, default: str | None = None) -> str:
    value = form.get(name, default)
    if value is None:
        raise BadRequest(f"{name}: required form field is missing")
    if not isinstance(value, str):
        raise BadRequest(f"{name}: must be a text field, not a file")
    return value


@router.post(
    "/v1/files",
    status_code=200,
    response_model=FileObject,
    summary="Upload a JSONL file (OpenAI files API)",
    openapi_extra=_UPLOAD_FORM,
)
@reads_own_body
async def upload_file(request: Request, ingest: IngestDep) -> FileObject:
    caller = await principal(request, ingest)
    form = await _upload_form(request, ingest.settings.max_upload_bytes)
    try:
        return await _store_upload_form(ingest, caller, form)
    finally:
        await form.close()


async def _store_upload_form(ingest: Ingest, caller: auth.Principal, form: FormData) -> FileObject:
    file = form.get("file")
    if not isinstance(file, StarletteUploadFile):
        raise BadRequest("file: required, as a file part of the form")
    purpose = _form_text(form, "purpose")
    format = _form_text(form, "format", "auto")
    if purpose not in uploads.PURPOSES:
        raise BadRequest(f"purpose: {purpose!r} is not one of {', '.join(uploads.PURPOSES)}")
    check_format(format)
    file_id = uploads.new_file_id()
    size = await asyncio.to_thread(
        uploads.store_upload,
        ingest.store,
        file.file,
        tenant=caller.tenant_id,
        file_id=file_id,
        spool_dir=ingest.spool_dir,
    )
    owner = leases.new_lease_owner()
    row = UploadedFile(
        id=file_id,
        tenant=caller.tenant_id,
        filename=file.filename or "upload.jsonl",
        purpose=purpose,
        bytes=size,
        format=format,
        **leases.first_lease(owner, lease_s=ingest.settings.upload_lease_s),
    )
    with session_scope(ingest.engine) as session:
        session.add(row)
        session.commit()
        session.refresh(row)
    ingest.process_in_background(row, leased_to=owner)
    return FileObject.of(row)


def _file_row(engine: Engine, tenant: str, file_id: str) -> UploadedFile:
    with session_scope(engine) as session:
        row = session.get(UploadedFile, file_id)
    if row is None or row.tenant != tenant:
        raise NotFound(f"file {file_id!r} not found")
    return row


@router.get("/v1/files/{file_id}", response_model=FileObject)
def get_file(file_id: str, principal: auth.PrincipalDep, engine: EngineDep) -> FileObject:
    return FileObject.of(_file_row(engine, principal.tenant_id, file_id))


async def _owned_file(request: Request, ingest: Ingest, file_id: str) -> UploadedFile:
    """The caller's file by id; another tenant's is as absent as a missing one (404)."""
    caller = await principal(request, ingest)
    return await asyncio.to_thread(_file_row, ingest.engine, caller.tenant_id, file_id)


@router.get(
    "/v1/files/{file_id}/content",
    summary="The file as uploaded",
    response_class=StreamingResponse,
)
async def file_content(file_id: str, request: Request, ingest: IngestDep) -> StreamingResponse:
    row = await _owned_file(request, ingest, file_id)
    key = uploads.file_key(row.tenant, row.id)
    return await _download(ingest, key, f"file {file_id!r} not found", filename=row.filename)


@router.get(
    "/v1/files/{file_id}/errors",
    summary="Every rejected line of a processed file (JSONL)",
    response_class=StreamingResponse,
)
async def file_errors(file_id: str, request: Request, ingest: IngestDep) -> StreamingResponse:
    row = await _owned_file(request, ingest, file_id)
    if row.status != "processed":
        raise Conflict(
            f"file {file_id!r} is {row.status}: its rejected lines are known once processed"
        )
    key = uploads.file_errors_key(row.tenant, row.id)
    return await _download(ingest, key, f"file {file_id!r} has no list of rejected lines")


@router.delete("/v1/files/{file_id}", response_model=FileDeleted, summary="Delete a file")
async def delete_file(file_id: str, request: Request, ingest: IngestDep) -> FileDeleted:
    """The file, its list of rejected lines and its row go; samples made from it stay."""
    row = await _owned_file(request, ingest, file_id)
    for key in (uploads.file_key(row.tenant, row.id), uploads.file_errors_key(row.tenant, row.id)):
        await asyncio.to_thread(ingest.store.delete, key)
    await asyncio.to_thread(_delete_row, ingest.engine, row.id)
    return FileDeleted(id=row.id, deleted=True)


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
        raise NotFound(missing) from None
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


@router.get("/v1/files", response_model=FileList)
def list_files(principal: auth.PrincipalDep, engine: EngineDep) -> FileList:
    with session_scope(engine) as session:
        rows = session.exec(
            select(UploadedFile)
            .where(UploadedFile.tenant == principal.tenant_id)
            .order_by(col(UploadedFile.created_at).desc())
        ).all()
    return FileList(data=[FileObject.of(row) for row in rows])


@router.post(
    "/v1/samples/import",
    response_model=ImportResult,
    summary="Import JSONL samples from the request body",
)
@reads_own_body
async def import_samples(
    request: Request,
    ingest: IngestDep,
    format: str = "auto",
    import_id: Annotated[str | None, Query(max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")] = None,
) -> ImportResult:
    """The body is read as it arrives. Re-sending with the same `import_id` stores nothing twice."""
    caller = await principal(request, ingest)
    check_format(format)
    file_id = import_id or f"import-{uuid.uuid4().hex[:24]}"
    errors_key = uploads.import_errors_key(caller.tenant_id, file_id)
    with uploads.rejection_log(ingest.spool_dir) as rejections:
        report = await uploads.import_lines(
            ingest.pipeline,
            request.stream(),
            tenant=caller.tenant_id,
            file_id=file_id,
            format=format,
            rejections=rejections,
        )
        if await uploads.store_rejections(rejections, ingest.store, errors_key):
            report.errors_url = f"/v1/samples/imports/{file_id}/errors"
    return ImportResult.of(file_id, report)


@router.get(
    "/v1/samples/imports/{import_id}/errors",
    summary="Every rejected line of a streamed import (JSONL)",
    response_class=StreamingResponse,
)
async def import_errors(import_id: str, request: Request, ingest: IngestDep) -> StreamingResponse:
    caller = await principal(request, ingest)
    key = uploads.import_errors_key(caller.tenant_id, import_id)
    return await _download(ingest, key, f"import {import_id!r} not found")

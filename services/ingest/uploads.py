"""Uploads: JSONL files and import streams become samples, line by line, never whole in memory.

`POST /v1/files` stores the file in object storage first (so it survives a restart), answers at
once like OpenAI's files API, and processes it in the background; a file still `uploaded` or
`processing` when the service stops is processed again at start-up (sample ids come from
`<file id>:<line>`, so doing it twice stores nothing twice). `POST /v1/samples/import` reads the
request body as it arrives and answers with the report.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterable, Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

import orjson
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from services.ingest.formats import ImportReport, LineError, ParsedLine, aparse_lines
from services.ingest.models import UploadedFile
from services.ingest.pipeline import CapturePipeline
from shared.chat import Sample
from shared.db import session_scope
from shared.storage import ObjectStore

log = logging.getLogger("tuneloop.ingest.uploads")

PURPOSES = ("fine-tune", "samples")
_CHUNK = 1024 * 1024
_BATCH = 256


def new_file_id() -> str:
    return f"file-{uuid.uuid4().hex[:24]}"


def file_key(tenant: str, file_id: str) -> str:
    return f"tenants/{tenant}/files/{file_id}.jsonl"


async def import_lines(
    pipeline: CapturePipeline,
    chunks: AsyncIterable[bytes] | Iterable[bytes],
    *,
    tenant: str,
    file_id: str,
    format: str,
) -> ImportReport:
    """Parse, hand samples to the pipeline in batches, count what was rejected. Raises
    UnknownFormat (a ValueError) before reading anything when `format` is not known."""
    report = ImportReport()
    batch: list[Sample] = []
    created_at = datetime.now(UTC)
    async for result in aparse_lines(
        chunks, tenant=tenant, file_id=file_id, created_at=created_at, format=format, report=report
    ):
        if isinstance(result, LineError):
            pipeline.fidelity.count_rejected(tenant, "upload", result.reason)
            continue
        assert isinstance(result, ParsedLine)
        batch.extend(result.samples)
        for dropped in result.dropped:
            pipeline.fidelity.count_dropped(tenant, "upload", dropped.reason)
        if len(batch) >= _BATCH:
            await pipeline.deliver_many(batch)
            batch = []
            await asyncio.sleep(0)  # parsing is CPU work: let the gateway's calls through
    if batch:
        await pipeline.deliver_many(batch)
    return report


def _file_chunks(handle: BinaryIO) -> Iterator[bytes]:
    while chunk := handle.read(_CHUNK):
        yield chunk


def store_upload(
    store: ObjectStore, source: BinaryIO, *, tenant: str, file_id: str, spool_dir: Path
) -> int:
    """Copy the uploaded stream to a local file, then to object storage. Returns its size."""
    spool_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=spool_dir, suffix=".upload") as local:
        shutil.copyfileobj(source, local, _CHUNK)
        local.flush()
        size = local.tell()
        store.put_file(file_key(tenant, file_id), local.name, content_type="application/jsonl")
    return size


def _set_status(engine: Engine, file_id: str, **fields: Any) -> None:
    with session_scope(engine) as session:
        row = session.get(UploadedFile, file_id)
        if row is None:
            return
        for name, value in fields.items():
            setattr(row, name, value)
        session.add(row)
        session.commit()


async def process_file(
    *,
    engine: Engine,
    store: ObjectStore,
    pipeline: CapturePipeline,
    row: UploadedFile,
    spool_dir: Path,
) -> None:
    """Fetch the stored file and import it; the outcome goes on the file's row."""
    await asyncio.to_thread(_set_status, engine, row.id, status="processing")
    local = spool_dir / f"{row.id}.jsonl"  # get_file makes the folder
    try:
        await asyncio.to_thread(store.get_file, file_key(row.tenant, row.id), local)
        with local.open("rb") as handle:
            report = await import_lines(
                pipeline, _file_chunks(handle), tenant=row.tenant, file_id=row.id, format=row.format
            )
    except Exception as exc:
        log.exception("file %s could not be processed", row.id)
        await asyncio.to_thread(
            _set_status,
            engine,
            row.id,
            status="error",
            status_details=f"{type(exc).__name__}: {exc}"[:2000],
        )
        return
    finally:
        local.unlink(missing_ok=True)
    summary = report.to_dict()
    await asyncio.to_thread(
        _set_status,
        engine,
        row.id,
        status="processed",
        status_details=str(summary.get("status_details", ""))[:2000],
        report=report.to_json(),
    )


def unfinished(session: Session) -> list[UploadedFile]:
    """Files a stopped process did not finish; they are processed again."""
    statement = select(UploadedFile).where(col(UploadedFile.status).in_(["uploaded", "processing"]))
    return list(session.exec(statement))


def file_object(row: UploadedFile) -> dict[str, Any]:
    """The OpenAI files API representation, plus the import report once there is one."""
    body: dict[str, Any] = {
        "id": row.id,
        "object": "file",
        "bytes": row.bytes,
        "created_at": int(row.created_at.timestamp()),
        "filename": row.filename,
        "purpose": row.purpose,
        "status": row.status,
        "status_details": row.status_details,
    }
    if row.report is not None:
        body["import_report"] = orjson.loads(row.report)
    return body

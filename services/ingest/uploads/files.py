"""Uploads: JSONL files and import streams become samples, line by line, never whole in memory.

`POST /v1/files` stores the file in object storage first (so it survives a restart), answers at
once like OpenAI's files API, and processes it in the background. One live process works a file:
it takes a lease on the file's row with one conditional UPDATE and renews it while it works
(leases.py). Every process sweeps now and then for unfinished files nobody holds (new ones, and
those whose process died and let the lease run out) and takes them over. Sample ids come from
`<file id>:<line>`, so a file worked twice stores nothing twice. `POST /v1/samples/import`
reads the request body as it arrives and answers with the report. A file with purpose `evals` is
checked, not imported (eval_files.py).

A report lists the first 1,000 rejected lines; every one of them, however many, is written to a
local file as the upload streams (`RejectionLog`) and stored beside the upload as JSONL, served
by `GET /v1/files/{id}/errors` and `GET /v1/samples/imports/{id}/errors`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterable, Callable, Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, BinaryIO

import orjson
from sqlalchemy.engine import Engine

from services.ingest.capture.pipeline import CapturePipeline
from services.ingest.models import UploadedFile
from services.ingest.uploads import eval_files
from services.ingest.uploads.formats import ImportReport, LineError, ParsedLine, aparse_lines
from services.ingest.uploads.formats.report import error_entry
from services.ingest.uploads.leases import claim, claimable, finish, new_lease_owner, release, renew
from shared.chat import Sample
from shared.processes import pid_alive
from shared.storage import ObjectStore, StorageError

log = logging.getLogger("tuneloop.ingest.uploads")

# `evals`: eval items, checked and kept, never imported as samples (eval_files.py).
PURPOSES = ("fine-tune", "samples", eval_files.PURPOSE)
_CHUNK = 1024 * 1024
_BATCH = 256


def new_file_id() -> str:
    return f"file-{uuid.uuid4().hex[:24]}"


def file_key(tenant: str, file_id: str) -> str:
    return f"tenants/{tenant}/files/{file_id}.jsonl"


def file_errors_key(tenant: str, file_id: str) -> str:
    """Every rejected line of an uploaded file, as JSONL."""
    return f"tenants/{tenant}/files/{file_id}.errors.jsonl"


def import_errors_key(tenant: str, import_id: str) -> str:
    """Every rejected line of a streamed import, as JSONL (a new import under the same id
    replaces it)."""
    return f"tenants/{tenant}/imports/{import_id}.errors.jsonl"


class RejectionLog:
    """Every rejected line of one upload, written to a local spool file as the upload streams
    and stored in object storage once it is done: the report lists only the first 1,000, and a
    file can reject millions. Made by `rejection_log`, which removes the local file."""

    def __init__(self, file: IO[bytes]) -> None:
        self._file = file

    def add(self, error: LineError) -> None:
        self._file.write(orjson.dumps(error_entry(error)) + b"\n")

    def store(self, store: ObjectStore, key: str) -> None:
        """Blocking: run it in a thread."""
        self._file.flush()
        store.put_file(key, self._file.name, content_type="application/jsonl")


async def store_rejections(rejections: RejectionLog, store: ObjectStore, key: str) -> bool:
    """Store the complete list; False (logged) when object storage fails. The upload itself is
    done by then, its samples captured: only the list is missing, and the caller's report says
    so (`errors_url` null) rather than the upload failing."""
    try:
        await asyncio.to_thread(rejections.store, store, key)
    except StorageError as exc:
        log.warning("the rejected lines for %s could not be stored: %s", key, exc)
        return False
    return True


@contextlib.contextmanager
def rejection_log(spool_dir: Path) -> Iterator[RejectionLog]:
    spool_dir.mkdir(parents=True, exist_ok=True)
    # `<pid>.<random>.upload`: clear_dead_spool removes it if this process is killed.
    with tempfile.NamedTemporaryFile(
        dir=spool_dir, prefix=f"{os.getpid()}.", suffix=".upload"
    ) as file:
        yield RejectionLog(file)


async def import_lines(
    pipeline: CapturePipeline,
    chunks: AsyncIterable[bytes] | Iterable[bytes],
    *,
    tenant: str,
    file_id: str,
    format: str,
    rejections: RejectionLog | None = None,
) -> ImportReport:
    """Parse, hand samples to the pipeline in batches, count what was rejected (each rejected
    line also to `rejections`). Raises UnknownFormat (a ValueError) before reading anything
    when `format` is not known."""
    report = ImportReport(on_error=None if rejections is None else rejections.add)
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
    # The pid leads the name so that clear_dead_spool knows a killed process's leftovers.
    with tempfile.NamedTemporaryFile(
        dir=spool_dir, prefix=f"{os.getpid()}.", suffix=".upload"
    ) as local:
        shutil.copyfileobj(source, local, _CHUNK)
        local.flush()
        size = local.tell()
        store.put_file(file_key(tenant, file_id), local.name, content_type="application/jsonl")
    return size


def _spool_pid(name: str) -> int | None:
    """The pid in a spool file's name: `<pid>.<random>.upload` (store_upload) or
    `<file id>.<pid>.<random>.jsonl` (_import_file)."""
    parts = name.split(".")
    if parts[-1] == "upload":
        field = parts[0]
    elif parts[-1] == "jsonl" and len(parts) == 4:
        field = parts[1]
    else:
        return None
    return int(field) if field.isdigit() else None


def clear_dead_spool(spool_dir: Path) -> int:
    """Delete spool files left by processes of this machine that were killed mid-upload or
    mid-import (their work is redone from object storage); returns how many."""
    removed = 0
    for path in spool_dir.glob("*"):
        pid = _spool_pid(path.name)
        if pid is not None and not pid_alive(pid):
            path.unlink(missing_ok=True)
            removed += 1
    return removed


# --- working a file ---------------------------------------------------------------------------


async def sweep(engine: Engine, *, every_s: float, start: Callable[[UploadedFile], None]) -> None:
    """Forever: hand each claimable file to `start`, which claims it before working it (several
    processes sweep; the claim decides which one works the file)."""
    while True:
        try:
            rows = await asyncio.to_thread(claimable, engine)
        except Exception:
            log.warning("upload sweep failed; next one in %.0f s", every_s, exc_info=True)
            rows = []
        for row in rows:
            start(row)
        await asyncio.sleep(every_s)


async def claim_and_process(
    *,
    engine: Engine,
    store: ObjectStore,
    pipeline: CapturePipeline,
    row: UploadedFile,
    spool_dir: Path,
    lease_s: float,
    max_attempts: int,
    leased_to: str | None = None,
) -> None:
    """Work the file if this process wins its lease; otherwise leave it to the holder. A new
    upload's row, written already leased (`leased_to`, see first_lease), is worked at once."""
    owner = leased_to
    if owner is None:
        owner = new_lease_owner()
        try:
            claimed = await asyncio.to_thread(
                claim, engine, row.id, owner=owner, lease_s=lease_s, max_attempts=max_attempts
            )
        except Exception:
            log.warning(
                "file %s could not be claimed; a later sweep tries again", row.id, exc_info=True
            )
            return
        if claimed is None:
            log.debug("file %s is held by another process or done", row.id)
            return
        row = claimed
    await process_file(
        engine=engine,
        store=store,
        pipeline=pipeline,
        row=row,
        spool_dir=spool_dir,
        owner=owner,
        lease_s=lease_s,
    )


async def process_file(
    *,
    engine: Engine,
    store: ObjectStore,
    pipeline: CapturePipeline,
    row: UploadedFile,
    spool_dir: Path,
    owner: str,
    lease_s: float,
) -> None:
    """Import a file whose lease `owner` holds, renewing the lease until done. Stops when another
    process took the lease over (this one was paused past it), and then writes nothing: the
    outcome on the row is the new holder's."""
    work = asyncio.create_task(_import_file(store, pipeline, row, spool_dir))
    keeper = asyncio.create_task(_keep_lease(engine, row.id, owner=owner, lease_s=lease_s))
    try:
        done, _ = await asyncio.wait((work, keeper), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        # Shutting down: a live process may take the file at once instead of after the lease.
        with contextlib.suppress(Exception):
            release(engine, row.id, owner=owner)
        raise
    finally:
        work.cancel()
        keeper.cancel()
        await asyncio.gather(work, keeper, return_exceptions=True)
    if work not in done:
        log.warning("file %s: its lease was taken over by another process; stopped", row.id)
        return
    try:
        mine = await asyncio.to_thread(finish, engine, row.id, owner=owner, **work.result())
    except Exception:
        log.warning("file %s: outcome not written; done again once the lease runs out", row.id)
        return
    if not mine:
        log.warning(
            "file %s: lease lost before the outcome was written; the new holder's stands", row.id
        )


async def _keep_lease(engine: Engine, file_id: str, *, owner: str, lease_s: float) -> None:
    """Renew the lease every third of it; return once another process holds it."""
    while True:
        await asyncio.sleep(lease_s / 3)
        try:
            mine = await asyncio.to_thread(renew, engine, file_id, owner=owner, lease_s=lease_s)
        except Exception:
            # The database away for a moment: two more tries before the lease runs out.
            log.warning("file %s: lease renewal failed", file_id, exc_info=True)
            continue
        if not mine:
            return


async def _import_file(
    store: ObjectStore, pipeline: CapturePipeline, row: UploadedFile, spool_dir: Path
) -> dict[str, Any]:
    """Fetch the stored file and import it. Returns the outcome, as the row's fields."""
    # A name of this attempt's own: two processes on one machine never share a spool file, even
    # if both worked the file. get_file makes the folder.
    local = spool_dir / f"{row.id}.{os.getpid()}.{uuid.uuid4().hex[:8]}.jsonl"
    try:
        await asyncio.to_thread(store.get_file, file_key(row.tenant, row.id), local)
        if row.purpose == eval_files.PURPOSE:
            with local.open("rb") as handle:
                return await asyncio.to_thread(eval_files.check_file, handle)
        with local.open("rb") as handle, rejection_log(spool_dir) as rejections:
            report = await import_lines(
                pipeline,
                _file_chunks(handle),
                tenant=row.tenant,
                file_id=row.id,
                format=row.format,
                rejections=rejections,
            )
            listed = await store_rejections(rejections, store, file_errors_key(row.tenant, row.id))
    except Exception as exc:
        log.exception("file %s could not be processed", row.id)
        return {"status": "error", "status_details": f"{type(exc).__name__}: {exc}"[:2000]}
    finally:
        local.unlink(missing_ok=True)
    report.errors_url = f"/v1/files/{row.id}/errors" if listed else None
    summary = report.to_dict()
    return {
        "status": "processed",
        "status_details": str(summary.get("status_details", ""))[:2000],
        "report": report.to_json(),
    }


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

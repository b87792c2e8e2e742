"""`tuneloop upload FILE`: send a JSONL file to the files API with a progress bar, wait until
ingest has read it, and show its import report, every rejected line listed (up to the 1,000 the
report holds) with its number and why."""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal, cast

import openai
import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

from shared.dev.cli.client import gateway
from shared.dev.cli.errors import NOT_OK, CliError
from shared.dev.cli.output import fields, out, table

POLL_S = 0.5
WAIT_S = 600.0  # a file of a million lines is read in about a minute (docs/ingest.md)
Purpose = Literal["fine-tune", "samples"]


class _Counted(io.FileIO):
    """The file as the SDK streams it, telling the progress bar how far it has got (by position,
    so a retried upload, read again from the start, shows that too)."""

    def __init__(self, path: Path, on_read: Callable[[int], None]) -> None:
        super().__init__(path, "rb")
        self._on_read = on_read

    def read(self, size: int | None = -1, /) -> bytes:
        chunk = super().read(size)
        self._on_read(self.tell())
        return chunk


def send(client: openai.OpenAI, path: Path, purpose: str, format: str) -> dict[str, Any]:
    """POST /v1/files with a progress bar; the file object (status `uploaded`)."""
    columns = (
        TextColumn("uploading {task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
    )
    extra = {"format": format} if format != "auto" else None
    with Progress(*columns, console=out, transient=True) as progress:
        task = progress.add_task(path.name, total=path.stat().st_size)
        with _Counted(path, lambda done: progress.update(task, completed=done)) as handle:
            created = client.files.create(
                file=(path.name, handle), purpose=cast(Any, purpose), extra_body=extra
            )
    return created.model_dump()


def processed(client: openai.OpenAI, file_id: str, wait_s: float = WAIT_S) -> dict[str, Any]:
    """The file once ingest has read it (`processed` with its report, or `error`)."""
    deadline = time.monotonic() + wait_s
    with out.status(f"reading {file_id}..."):
        while True:
            found = client.files.retrieve(file_id).model_dump()
            if found["status"] not in ("uploaded", "processing"):
                return found
            if time.monotonic() > deadline:
                raise CliError(f"{file_id} is still {found['status']} after {wait_s:.0f} s")
            time.sleep(POLL_S)


def show_report(found: dict[str, Any]) -> int:
    """The file and its import report; NOT_OK when a line was rejected or the file failed."""
    report = found.get("import_report") or {}
    out.print(
        fields(
            f"file {found['id']}",
            [
                ("filename", found.get("filename")),
                ("purpose", found.get("purpose")),
                ("status", found.get("status")),
                ("lines", report.get("total_lines")),
                ("accepted", report.get("accepted_lines")),
                ("rejected", report.get("rejected_lines")),
                ("samples", report.get("samples")),
                ("formats", report.get("formats")),
                ("details", found.get("status_details")),
            ],
        )
    )
    errors = report.get("errors") or []
    if errors:
        rows = [(e["line"], e.get("format"), e["reason"]) for e in errors]
        out.print(table("rejected lines", ("line", "format", "reason"), rows))
        if report.get("errors_truncated"):
            out.print(
                f"{len(errors)} of {report['rejected_lines']} shown; every one: "
                f"GET {report.get('errors_url') or '(not kept)'}",
                highlight=False,
            )
    if found.get("status") == "error" or report.get("rejected_lines"):
        return NOT_OK
    return 0


def upload(
    ctx: typer.Context,
    path: Annotated[
        Path, typer.Argument(exists=True, dir_okay=False, readable=True, help="a JSONL file")
    ],
    purpose: Annotated[
        str, typer.Option(help="fine-tune (training data) or samples (captured traffic)")
    ] = "fine-tune",
    format: Annotated[
        str, typer.Option(help="auto (per line), or one upload format (docs/ingest.md)")
    ] = "auto",
    wait: Annotated[
        bool, typer.Option(help="wait until the file is read and show its report")
    ] = True,
) -> None:
    """Upload a JSONL file (progress bar), then show its import report: rejected lines in a
    table. Exits 4 when a line was rejected (the rest is kept)."""
    client = gateway(ctx)
    created = send(client, path, purpose, format)
    out.print(f"uploaded {path.name} as {created['id']} ({created['bytes']:,} bytes)")
    if not wait:
        return
    code = show_report(processed(client, str(created["id"])))
    if code:
        raise typer.Exit(code)

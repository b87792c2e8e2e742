"""One uploaded line -> samples or a rejection; and the loop over a whole upload stream."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

import orjson
from pydantic import ValidationError

from services.ingest.normalize import NormalizeError
from services.ingest.uploads.formats import logs
from services.ingest.uploads.formats._common import Chat, JsonObject, Notes, build, kind
from services.ingest.uploads.formats.alpaca import parse_alpaca
from services.ingest.uploads.formats.detect import LOG_FORMATS, Format, check_format, detect_format
from services.ingest.uploads.formats.finetune import parse_finetune
from services.ingest.uploads.formats.lines import MAX_LINE_BYTES, Line, LineSplitter, aiter_chunks
from services.ingest.uploads.formats.report import ImportReport
from services.ingest.uploads.formats.results import LineError, LineResult, ParsedLine
from services.ingest.uploads.formats.sharegpt import parse_sharegpt
from shared.chat import MetadataValue, Sample, describe_errors

logger = logging.getLogger(__name__)

_CHAT_PARSERS: dict[Format, Callable[[JsonObject, Notes], Chat]] = {
    "openai_finetune": parse_finetune,
    "sharegpt": parse_sharegpt,
    "alpaca": parse_alpaca,
}


@dataclass(frozen=True)
class _Where:
    """Who uploaded the line and where it sits: what every sample made from it carries."""

    tenant: str
    source_ref: str
    created_at: datetime


def parse_line(
    line: bytes,
    *,
    line_number: int,
    tenant: str,
    file_id: str,
    format: str = "auto",
    created_at: datetime,
) -> LineResult:
    """The samples of one JSONL line, or a LineError saying why it was rejected.

    Any content gives one of the two; only an unknown `format` raises (UnknownFormat), being a
    mistake of the request rather than of the line. `source_ref` is `<file_id>:<line_number>`,
    so importing the same file again gives the same sample ids.
    """
    asked = check_format(format)
    where = _Where(tenant, f"{file_id}:{line_number}", created_at)
    try:
        return _parse(line, line_number, asked, where)
    except Exception:
        # A bug must cost one line, not the rest of a 200 MB upload; the log keeps the trace.
        logger.exception("internal error reading line %d of %s", line_number, file_id)
        return LineError(line_number, "internal error while reading this line (logged)")


def _parse(
    line: bytes, line_number: int, asked: Format | Literal["auto"], where: _Where
) -> LineResult:
    chosen: Format | None = None
    record: JsonObject | None = None
    try:
        record = _load(line)
        chosen = detect_format(record).format if asked == "auto" else asked
        samples, notes = _read(chosen, record, where)
    except NormalizeError as exc:
        return LineError(line_number, _reason(exc, record, asked), chosen)
    except ValidationError as exc:
        # The readers build models through `build`; this is the backstop for any other path.
        return LineError(line_number, "; ".join(describe_errors(exc)[:3]), chosen)
    return ParsedLine(line_number, chosen, samples, notes.dropped)


def _reason(exc: NormalizeError, record: JsonObject | None, asked: Format | Literal["auto"]) -> str:
    """The error, and when a forced format failed on a line that looks like another, which."""
    reason = f"{exc.path}: {exc.reason}" if exc.path else exc.reason
    if asked == "auto" or record is None:
        return reason
    try:
        detected = detect_format(record)
    except NormalizeError:
        return reason
    if detected.format != asked:
        reason += f" (the line looks like {detected.format}: {detected.evidence})"
    return reason


def _load(line: bytes) -> JsonObject:
    try:
        value = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise NormalizeError("", _json_problem(line, exc)) from None
    if not isinstance(value, dict):
        raise NormalizeError("", f"must be a JSON object, not {kind(value)}")
    return value


def _json_problem(line: bytes, exc: orjson.JSONDecodeError) -> str:
    try:
        line.decode("utf-8")
    except UnicodeDecodeError as bad:
        return f"not valid UTF-8 (byte 0x{line[bad.start]:02x} at offset {bad.start})"
    return f"not valid JSON ({exc.msg} at column {exc.colno})"


def _read(fmt: Format, record: JsonObject, where: _Where) -> tuple[list[Sample], Notes]:
    notes = Notes()
    metadata: dict[str, MetadataValue] = {"upload_format": fmt}
    if fmt in LOG_FORMATS:
        log = logs.read_record(record)
        exchange = logs.to_exchange(
            log,
            LOG_FORMATS[fmt],
            tenant=where.tenant,
            source_ref=where.source_ref,
            created_at=where.created_at,
            metadata=metadata,
        )
        normalized = logs.normalize_log(log, exchange)
        notes.dropped += normalized.dropped
        notes.unknown_keys(record, log.known_keys, "")
        return normalized.samples, notes
    chat = _CHAT_PARSERS[fmt](record, notes)
    sample = build(
        Sample,
        "",
        tenant=where.tenant,
        source="upload",
        source_ref=where.source_ref,
        created_at=where.created_at,
        messages=chat.messages,
        tools=chat.tools,
        params=chat.params,
        metadata=metadata,
    )
    return [sample], notes


@dataclass(frozen=True)
class _Upload:
    tenant: str
    file_id: str
    format: str
    created_at: datetime
    report: ImportReport | None

    def result(self, item: Line | LineError) -> LineResult:
        result = item if isinstance(item, LineError) else self._parse(item)
        if self.report is not None:
            self.report.add(result)
        return result

    def _parse(self, line: Line) -> LineResult:
        return parse_line(
            line.data,
            line_number=line.number,
            tenant=self.tenant,
            file_id=self.file_id,
            format=self.format,
            created_at=self.created_at,
        )


def parse_lines(
    chunks: Iterable[bytes],
    *,
    tenant: str,
    file_id: str,
    created_at: datetime,
    format: str = "auto",
    report: ImportReport | None = None,
    max_line_bytes: int = MAX_LINE_BYTES,
) -> Iterator[LineResult]:
    """The result of every non-blank line of an upload given as byte chunks, in order, each one
    also added to `report`. Memory stays within one line (at most `max_line_bytes`)."""
    check_format(format)  # before reading anything: a bad format is the request's fault
    upload = _Upload(tenant, file_id, format, created_at, report)
    splitter = LineSplitter(max_line_bytes)
    for chunk in chunks:
        for item in splitter.feed(chunk):
            yield upload.result(item)
    for item in splitter.close():
        yield upload.result(item)
    if report is not None:
        report.count_lines(splitter.lines)


async def aparse_lines(
    chunks: AsyncIterable[bytes] | Iterable[bytes],
    *,
    tenant: str,
    file_id: str,
    created_at: datetime,
    format: str = "auto",
    report: ImportReport | None = None,
    max_line_bytes: int = MAX_LINE_BYTES,
) -> AsyncIterator[LineResult]:
    """`parse_lines` over an async byte stream (the HTTP request body). Parsing is CPU work done
    on the calling loop; a caller that must stay responsive runs it in a worker thread."""
    check_format(format)
    upload = _Upload(tenant, file_id, format, created_at, report)
    splitter = LineSplitter(max_line_bytes)
    async for chunk in aiter_chunks(chunks):
        for item in splitter.feed(chunk):
            yield upload.result(item)
    for item in splitter.close():
        yield upload.result(item)
    if report is not None:
        report.count_lines(splitter.lines)

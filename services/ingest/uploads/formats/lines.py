"""Incremental JSONL line splitting over a byte stream, so an upload of any size is read one
line at a time and never held in memory whole.

Lines end at `\\n` (a `\\r` before it is dropped, and a last line may lack the newline). Lines
are numbered from 1, blank ones included, so a number matches what an editor shows; blank lines
are not yielded. A UTF-8 BOM at the start of line 1 is removed. A line longer than the limit is
reported as a `LineError` and its bytes are discarded as they arrive, so one runaway line costs
at most the limit in memory.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator
from typing import NamedTuple

from services.ingest.uploads.formats.results import LineError

MAX_LINE_BYTES = 8 * 1024 * 1024
_BOM = b"\xef\xbb\xbf"


class Line(NamedTuple):
    """One non-blank line: its 1-based number and its bytes without the line ending."""

    number: int
    data: bytes


class LineSplitter:
    """Push chunks in with `feed`, take complete lines out; `close` flushes the last line.

    Both the sync and the async readers drive this one state machine, so they cannot disagree.
    """

    def __init__(self, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        if max_line_bytes < 1:
            raise ValueError("max_line_bytes must be at least 1")
        self.max_line_bytes = max_line_bytes
        # Lines completed so far, blank ones included: the number of the last line seen.
        self.lines = 0
        self._buffer = bytearray()
        self._too_long = False

    @property
    def buffered(self) -> int:
        """Bytes held for the line in progress: never more than the limit plus one."""
        return len(self._buffer)

    def feed(self, chunk: bytes) -> list[Line | LineError]:
        """The lines that `chunk` completes (a chunk may complete none, or many)."""
        out: list[Line | LineError] = []
        view = memoryview(chunk)
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            self._append(view[start:end])
            if (item := self._finish()) is not None:
                out.append(item)
            start = end + 1
        self._append(view[start:])
        return out

    def close(self) -> list[Line | LineError]:
        """The last line, when the stream does not end with a newline."""
        if not self._buffer and not self._too_long:
            return []
        item = self._finish()
        return [] if item is None else [item]

    def _append(self, piece: memoryview) -> None:
        if self._too_long or not piece:
            return
        # One byte of slack for the `\r` of a CRLF ending, which is not part of the line.
        if len(self._buffer) + len(piece) > self.max_line_bytes + 1:
            self._too_long = True
            self._buffer = bytearray()  # give the memory back, not just the length
            return
        self._buffer += piece

    def _finish(self) -> Line | LineError | None:
        self.lines += 1
        if self._too_long:
            self._too_long = False
            return LineError(self.lines, self._too_long_reason())
        data = bytes(self._buffer)
        self._buffer.clear()
        if data.endswith(b"\r"):
            data = data[:-1]
        if self.lines == 1 and data.startswith(_BOM):
            data = data[len(_BOM) :]
        if len(data) > self.max_line_bytes:
            return LineError(self.lines, self._too_long_reason())
        if not data or data.isspace():
            return None
        return Line(self.lines, data)

    def _too_long_reason(self) -> str:
        return f"line is longer than the limit of {self.max_line_bytes:,} bytes"


def iter_lines(
    chunks: Iterable[bytes], *, max_line_bytes: int = MAX_LINE_BYTES
) -> Iterator[Line | LineError]:
    """The non-blank lines of a byte stream given as chunks of any size."""
    splitter = LineSplitter(max_line_bytes)
    for chunk in chunks:
        yield from splitter.feed(chunk)
    yield from splitter.close()


async def aiter_lines(
    chunks: AsyncIterable[bytes] | Iterable[bytes], *, max_line_bytes: int = MAX_LINE_BYTES
) -> AsyncIterator[Line | LineError]:
    """`iter_lines` over an async byte stream (e.g. Starlette's `request.stream()`)."""
    splitter = LineSplitter(max_line_bytes)
    async for chunk in aiter_chunks(chunks):
        for item in splitter.feed(chunk):
            yield item
    for item in splitter.close():
        yield item


async def aiter_chunks(chunks: AsyncIterable[bytes] | Iterable[bytes]) -> AsyncIterator[bytes]:
    """Chunks of an async or a plain iterable, as one async stream."""
    if isinstance(chunks, AsyncIterable):
        async for chunk in chunks:
            yield chunk
    else:
        for chunk in chunks:
            yield chunk

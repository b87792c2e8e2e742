"""The import report of one upload: what came in, what was kept, what was rejected and why.

It is built line by line as the upload streams, so its size is bounded whatever the file's:
rejections are listed up to a cap (the total is always exact; `on_error` sees every one, for the
complete list kept beside the upload, uploads.RejectionLog) and dropped-part reasons are counted
by kind, with line-specific indices taken out of their paths.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from services.ingest.uploads.formats.results import LineError, LineResult

MAX_LISTED_ERRORS = 1000
MAX_DROP_KINDS = 200
_INDEX = re.compile(r"\[\d+\]")
_OTHER_DROPS = "(other reasons)"


@dataclass
class ImportReport:
    max_listed_errors: int = MAX_LISTED_ERRORS
    max_drop_kinds: int = MAX_DROP_KINDS
    # Every line of the file, blank ones included (the number of the last line).
    total_lines: int = 0
    accepted_lines: int = 0
    rejected_lines: int = 0
    samples: int = 0
    formats: Counter[str] = field(default_factory=Counter)
    errors: list[LineError] = field(default_factory=list)
    dropped: Counter[str] = field(default_factory=Counter)
    # Called with every rejected line, listed or not.
    on_error: Callable[[LineError], None] | None = None
    # Where the complete list of rejected lines is served, when it is kept.
    errors_url: str | None = None

    def add(self, result: LineResult) -> None:
        self.total_lines = max(self.total_lines, result.line_number)
        if isinstance(result, LineError):
            self.rejected_lines += 1
            if self.on_error is not None:
                self.on_error(result)
            if len(self.errors) < self.max_listed_errors:
                self.errors.append(result)
            return
        self.accepted_lines += 1
        self.samples += len(result.samples)
        self.formats[result.format] += 1
        for note in result.dropped:
            self._count_drop(f"{_INDEX.sub('[]', note.path)}: {note.reason}")

    def count_lines(self, total: int) -> None:
        """The splitter's line count, so blank lines at the end of the file count too."""
        self.total_lines = max(self.total_lines, total)

    def _count_drop(self, kind: str) -> None:
        # A hostile file could make every reason unique; past the cap they are lumped together.
        if kind not in self.dropped and len(self.dropped) >= self.max_drop_kinds:
            kind = _OTHER_DROPS
        self.dropped[kind] += 1

    @property
    def blank_lines(self) -> int:
        return self.total_lines - self.accepted_lines - self.rejected_lines

    def status_details(self) -> str:
        """One sentence for people, like the `status_details` of an OpenAI file."""
        summary = (
            f"{self.accepted_lines:,} of {self.accepted_lines + self.rejected_lines:,} lines "
            f"accepted ({self.samples:,} samples)"
        )
        if not self.rejected_lines:
            return summary + "."
        first = f" (first: {self.errors[0]})" if self.errors else ""
        return f"{summary}; {self.rejected_lines:,} rejected{first}."

    def to_dict(self) -> dict[str, Any]:
        return {
            "total_lines": self.total_lines,
            "blank_lines": self.blank_lines,
            "accepted_lines": self.accepted_lines,
            "rejected_lines": self.rejected_lines,
            "samples": self.samples,
            "formats": dict(self.formats),
            "errors": [error_entry(error) for error in self.errors],
            "errors_truncated": self.rejected_lines > len(self.errors),
            "errors_url": self.errors_url,
            "dropped": dict(self.dropped.most_common()),
            "status_details": self.status_details(),
        }

    def to_json(self) -> bytes:
        return orjson.dumps(self.to_dict())


def error_entry(error: LineError) -> dict[str, Any]:
    """A rejected line as the report and the complete list give it."""
    return {"line": error.line_number, "reason": error.reason, "format": error.format}

"""Uploaded JSONL -> canonical samples: line splitting over a byte stream, per-line format
detection, one reader per format, and the import report. Pure domain code: no HTTP, bus or
storage (the upload route streams the body in and publishes what comes out).

Formats, and the keys that decide them when `format="auto"` (exactly one family's keys must be
there; two families' keys make the line ambiguous, and it is rejected asking for a `format`):

| format            | deciding keys                                                          |
|-------------------|------------------------------------------------------------------------|
| `openai_finetune` | `messages` (of `role`/`content` objects), no `response`               |
| `sharegpt`        | `conversations`, or `messages` whose first item has `from` but no `role` |
| `alpaca`          | `instruction`                                                          |
| `*_log`           | `request` + `response`, `req` + `resp` (OpenPipe), or `messages` + `response` (LiteLLM) |

A log line's provider is told by the URI of an HTTP record (`chat/completions`, `/messages`,
`generateContent`), the request (`contents` -> Gemini; `system`, `anthropic_version` or
`stop_sequences` -> Anthropic) and the response (`candidates` / `promptFeedback` /
`usageMetadata` -> Gemini, `type: "message"` or `"error"` -> Anthropic, `choices` or
`object: "chat.completion..."` -> OpenAI; for SSE text, `message_start` / `"candidates"` /
`chat.completion.chunk`). Signals that disagree reject the line; none at all with request
`messages` means OpenAI (its error bodies have no shape of their own). The shapes each reader
accepts are in the docstrings of `finetune`, `sharegpt`, `alpaca` and `logs`; the log readers
hand the bodies to `services.ingest.normalize`, which owns the provider wire formats.

Every sample gets `source="upload"` and `source_ref="<file_id>:<line>"` (so importing a file
again gives the same ids) and `metadata["upload_format"]`. A forced `format` that does not fit
is rejected with the reader's reason, plus what the line looks like instead.
"""

from services.ingest.uploads.formats.detect import (
    FORMATS,
    Detected,
    Format,
    UnknownFormat,
    check_format,
    detect_format,
)
from services.ingest.uploads.formats.lines import (
    MAX_LINE_BYTES,
    Line,
    LineSplitter,
    aiter_lines,
    iter_lines,
)
from services.ingest.uploads.formats.parse import aparse_lines, parse_line, parse_lines
from services.ingest.uploads.formats.report import ImportReport
from services.ingest.uploads.formats.results import LineError, LineResult, ParsedLine

__all__ = [
    "FORMATS",
    "MAX_LINE_BYTES",
    "Detected",
    "Format",
    "ImportReport",
    "Line",
    "LineError",
    "LineResult",
    "LineSplitter",
    "ParsedLine",
    "UnknownFormat",
    "aiter_lines",
    "aparse_lines",
    "check_format",
    "detect_format",
    "iter_lines",
    "parse_line",
    "parse_lines",
]

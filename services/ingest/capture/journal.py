"""A write-ahead journal of the calls the gateway answered, so a SIGKILL loses none of them.

Appending is all the gateway does with a captured call (one buffered write, no fsync: a killed
process leaves its writes in the kernel); the shipper process (shipper.py) reads the segments
as they grow, turns the calls into samples and deletes each segment once it is closed and
shipped.

A segment is named `<writer>-<n>.jsonl`, where the writer is the process's incarnation (pid and
start time, shared.processes.Incarnation), not its pid alone: a container restarts its process
under the same pid, and a new writer starting again at segment 0 under an old name would append
to a dead writer's segment, or have its live one taken for finished and deleted. Segments named
`<pid>-<n>.jsonl` were written by an earlier version of this module; no process writes them now,
so the shipper takes them as finished.

Files hold prompts before secrets are scrubbed: the directory is 0700 and each file 0600.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import orjson

from services.ingest.capture.call import CapturedCall
from services.ingest.capture.private_files import private_dir, private_file
from shared.processes import Incarnation, this_incarnation
from shared.settings import Settings

SUFFIX = ".jsonl"
# `<writer>.closed`: the writer closed its journal (a clean stop) and writes no more, though its
# process still runs for a moment; its last segment is finished once shipped.
CLOSED_SUFFIX = ".closed"


def journal_dir(settings: Settings) -> Path:
    return settings.app.data_dir.resolve() / "ingest" / "journal"


@dataclass(frozen=True)
class SegmentName:
    """What a segment's file name says: its writer (None for an earlier version's segment,
    whose writer is gone) and its number in the writer's series."""

    writer: Incarnation | None
    number: int

    @classmethod
    def parse(cls, path: Path) -> SegmentName | None:
        """None for any file that is not a segment (a shipper's offset file, the lock)."""
        if not path.name.endswith(SUFFIX):
            return None
        stem = path.name.removesuffix(SUFFIX)
        writer_name, _, number = stem.rpartition("-")
        if not number.isdigit() or not writer_name:
            return None
        if writer_name.isdigit():  # <pid>-<n>: an earlier version's
            return cls(None, int(number))
        writer = Incarnation.parse(writer_name)
        return cls(writer, int(number)) if writer is not None else None


class Journal:
    def __init__(
        self,
        directory: Path,
        *,
        segment_records: int = 2_000,
        segment_age_s: float = 10.0,
        writer: Incarnation | None = None,
    ) -> None:
        self.directory = directory
        private_dir(directory)
        self.writer = writer or this_incarnation()
        self._segment_records = segment_records
        self._segment_age_s = segment_age_s
        self._current = -1
        self._handle: IO[bytes] | None = None
        self._opened_at = 0.0
        self._written = 0
        self._rotate()

    def path(self, segment: int) -> Path:
        return self.directory / f"{self.writer.name}-{segment}{SUFFIX}"

    def _rotate(self) -> None:
        if self._handle is not None:
            self._handle.close()
        self._current += 1
        self._handle = private_file(self.path(self._current))
        self._opened_at = time.monotonic()
        self._written = 0

    def append(self, call: CapturedCall) -> None:
        if (
            self._written >= self._segment_records
            or time.monotonic() - self._opened_at > self._segment_age_s
        ):
            self._rotate()
        assert self._handle is not None
        self._handle.write(orjson.dumps(call.to_record()) + b"\n")
        self._handle.flush()
        self._written += 1

    def close(self) -> None:
        """Stop writing; the shipper ships what is left and deletes the segment."""
        if self._handle is not None:
            self._handle.close()
            self._handle = None
            private_file(self.directory / f"{self.writer.name}{CLOSED_SUFFIX}").close()

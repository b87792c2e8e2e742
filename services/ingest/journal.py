"""A write-ahead journal of captured calls, so a SIGKILL loses none of them.

Every call is appended (one buffered write, no fsync: a killed process leaves its writes in the
kernel) before it is queued, and marked done once it is published, rejected or in the spill
file. The journal is a series of segment files named `<pid>-<n>.jsonl`; a segment is deleted
when it is closed and all its calls are done. At start-up, segments of processes that no longer
run are handed back: their calls are processed again, which publishes nothing twice (event ids
are deterministic and the store is idempotent).

With `shipped=True` (`TUNELOOP_INGEST_CAPTURE=process`) the writer keeps no accounts: appending is
all the gateway does with a call, and a shipper process (shipper.py) reads the segments as they
grow, turns the calls into samples and deletes each segment once it is closed and shipped.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import IO

import orjson

from services.ingest.capture import CapturedCall
from shared.processes import pid_alive
from shared.settings import Settings

Ticket = int  # the segment number a call was written to


def journal_dir(settings: Settings) -> Path:
    return settings.app.data_dir.resolve() / "ingest" / "journal"


def segment_id(path: Path) -> tuple[int, int] | None:
    """(writer pid, segment number) of a live writer's segment `<pid>-<n>.jsonl`; None for any
    other file (an adopted segment, a shipper's offset file)."""
    pid, _, rest = path.name.partition("-")
    number = rest.removesuffix(".jsonl")
    if not (pid.isdigit() and number.isdigit() and rest.endswith(".jsonl")):
        return None
    return int(pid), int(number)


class Journal:
    def __init__(
        self,
        directory: Path,
        *,
        segment_records: int = 2_000,
        segment_age_s: float = 10.0,
        shipped: bool = False,
    ) -> None:
        self.directory = directory
        self._shipped = shipped
        directory.mkdir(parents=True, exist_ok=True)
        self._pid = os.getpid()
        self._segment_records = segment_records
        self._segment_age_s = segment_age_s
        self._current = -1
        self._handle: IO[bytes] | None = None
        self._opened_at = 0.0
        self._written = 0
        self._open: dict[Ticket, int] = {}  # segment -> calls not yet done
        self._rotate()

    def _path(self, segment: Ticket) -> Path:
        return self.directory / f"{self._pid}-{segment}.jsonl"

    def _rotate(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._drop_if_done(self._current)
        self._current += 1
        self._handle = self._path(self._current).open("ab")
        if not self._shipped:
            self._open[self._current] = 0
        self._opened_at = time.monotonic()
        self._written = 0

    def append(self, call: CapturedCall) -> Ticket:
        if (
            self._written >= self._segment_records
            or time.monotonic() - self._opened_at > self._segment_age_s
        ):
            self._rotate()
        assert self._handle is not None
        self._handle.write(orjson.dumps(call.to_record()) + b"\n")
        self._handle.flush()
        self._written += 1
        if not self._shipped:
            self._open[self._current] += 1
        return self._current

    def done(self, ticket: Ticket) -> None:
        self._open[ticket] -= 1
        if ticket != self._current:
            self._drop_if_done(ticket)

    def _drop_if_done(self, segment: Ticket) -> None:
        if self._open.get(segment) == 0:
            del self._open[segment]
            self._path(segment).unlink(missing_ok=True)

    def close(self) -> None:
        """Stop writing; the current segment goes once its calls are done (now, after a clean stop)."""
        if self._handle is not None:
            self._handle.close()
            self._handle = None
            self._drop_if_done(self._current)

    def orphans(self) -> list[Path]:
        """Segments left by processes that are gone (a crash, a kill)."""
        found = []
        for path in sorted(self.directory.glob("*-*.jsonl")):
            pid = int(path.name.split("-", 1)[0]) if path.name.split("-", 1)[0].isdigit() else -1
            if pid != self._pid and not pid_alive(pid):
                found.append(path)
        return found

    def adopt(self, orphan: Path) -> Path | None:
        """Take an orphan segment over (renamed under this pid, so a sibling process does not
        recover it too, and it is an orphan again if this process dies); None if one did."""
        adopted = self.directory / f"{self._pid}-adopted-{orphan.name}"
        try:
            orphan.rename(adopted)
        except FileNotFoundError:
            return None
        return adopted

    @staticmethod
    def calls(segment: Path) -> list[CapturedCall]:
        calls = []
        for line in segment.read_bytes().splitlines():
            with contextlib.suppress(orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                calls.append(
                    CapturedCall.from_record(orjson.loads(line))
                )  # a torn last line is skipped
        return calls

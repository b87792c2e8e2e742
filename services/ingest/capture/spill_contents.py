"""What the spill file holds, told without reading its samples: whose samples went into it
since it was last empty (the ledger), and how much waits in it now (the backlog).

The ledger is a small JSONL file beside the spill file: each process that spills (the service,
its shipper) counts per tenant in memory and appends one line per tenant every second or so
(`flush`), so an outage costs a line per tenant and second, not one per sample. The spill
watcher (spill_watch.py) reads it when the spill file is empty again and publishes what it
says, then removes it. Samples written back by a replay are not counted again: they are the
ones counted when first spilled.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import NamedTuple

import orjson

from services.ingest.capture.private_files import private_file
from shared.db import utcnow

LEDGER_NAME = "capture-spill-ledger.jsonl"
CLOSING_SUFFIX = ".closing"
_CHUNK = 1024 * 1024


@dataclass
class Tally:
    """One tenant's samples spilled (kept, and refused at the cap) over some time."""

    samples: int = 0
    bytes: int = 0
    refused: int = 0
    first: datetime | None = None
    last: datetime | None = None

    def add(self, other: Tally) -> None:
        self.samples += other.samples
        self.bytes += other.bytes
        self.refused += other.refused
        firsts = [t for t in (self.first, other.first) if t is not None]
        lasts = [t for t in (self.last, other.last) if t is not None]
        self.first = min(firsts) if firsts else None
        self.last = max(lasts) if lasts else None


class SpillLedger:
    """Per-tenant counts of what went into one spill file since it was last empty."""

    def __init__(self, path: Path, *, clock: Callable[[], datetime] = utcnow) -> None:
        self.path = path
        self._clock = clock
        self._counts: dict[str, Tally] = {}
        self._lock = threading.Lock()  # appends come from the event loop and from threads

    @classmethod
    def beside(cls, spill_path: Path) -> SpillLedger:
        return cls(spill_path.with_name(LEDGER_NAME))

    @property
    def closing_path(self) -> Path:
        return self.path.with_name(self.path.name + CLOSING_SUFFIX)

    def count(self, tenant: str, size: int, *, kept: bool) -> None:
        """A sample of `tenant` went into the spill file (`size` bytes), or was refused."""
        now = self._clock()
        with self._lock:
            tally = self._counts.setdefault(tenant, Tally(first=now))
            tally.last = now
            if kept:
                tally.samples += 1
                tally.bytes += size
            else:
                tally.refused += 1

    def flush(self) -> None:
        """Append what was counted since the last flush, one line per tenant."""
        with self._lock:
            counts, self._counts = self._counts, {}
        if not counts:
            return
        lines = b"".join(_line(tenant, tally) for tenant, tally in counts.items())
        with private_file(self.path) as handle:
            handle.write(lines)

    def has_lines(self) -> bool:
        return any(_size(path) > 0 for path in (self.path, self.closing_path))

    def claim(self) -> dict[str, Tally]:
        """Move the ledger aside (what is flushed from now on belongs to the next episode) and
        read it, with what an earlier claim left (its publishing failed); `release` once done."""
        if not self.closing_path.exists():
            with contextlib.suppress(FileNotFoundError):  # nothing was flushed
                self.path.rename(self.closing_path)
        return read(self.closing_path)

    def release(self) -> None:
        self.closing_path.unlink(missing_ok=True)


def read(path: Path) -> dict[str, Tally]:
    """A ledger file's lines summed per tenant; a torn last line (a kill) is skipped."""
    totals: dict[str, Tally] = {}
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return totals
    for line in raw.splitlines():
        try:
            entry = orjson.loads(line)
            tally = Tally(
                samples=int(entry["samples"]),
                bytes=int(entry["bytes"]),
                refused=int(entry["refused"]),
                first=datetime.fromisoformat(entry["first"]),
                last=datetime.fromisoformat(entry["last"]),
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            continue
        totals.setdefault(str(entry["tenant"]), Tally()).add(tally)
    return totals


def _line(tenant: str, tally: Tally) -> bytes:
    entry = {
        "tenant": tenant,
        "samples": tally.samples,
        "bytes": tally.bytes,
        "refused": tally.refused,
        "first": tally.first.isoformat() if tally.first else None,
        "last": tally.last.isoformat() if tally.last else None,
    }
    return orjson.dumps(entry) + b"\n"


class Backlog(NamedTuple):
    records: int
    bytes: int


class BacklogCounter:
    """Records and bytes waiting in a spill file (the live file and the claimed ones), each
    file's lines counted once as it grows: a file is append-only until it is renamed aside
    (same inode) and then read-only until it is deleted."""

    def __init__(self, files: Callable[[], Iterable[Path]]) -> None:
        self._files = files
        self._counted: dict[int, tuple[int, int]] = {}  # inode -> (bytes read, newlines)

    def count(self) -> Backlog:
        records = size = 0
        counted: dict[int, tuple[int, int]] = {}
        for path in self._files():
            try:
                stat = path.stat()
            except FileNotFoundError:  # replayed and removed just now
                continue
            done, lines = self._counted.get(stat.st_ino, (0, 0))
            if stat.st_size < done:  # a new file under an inode seen before
                done, lines = 0, 0
            if stat.st_size > done:
                try:
                    lines += _newlines(path, done, stat.st_size)
                except FileNotFoundError:
                    continue
                done = stat.st_size
            counted[stat.st_ino] = (done, lines)
            records, size = records + lines, size + done
        self._counted = counted
        return Backlog(records, size)


def _newlines(path: Path, start: int, end: int) -> int:
    found = 0
    with path.open("rb") as handle:
        handle.seek(start)
        left = end - start
        while left > 0:
            chunk = handle.read(min(_CHUNK, left))
            if not chunk:
                break
            found += chunk.count(b"\n")
            left -= len(chunk)
    return found


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0

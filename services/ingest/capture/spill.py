"""The spill file: what could not be published or stored yet (NATS or S3 away), capped, replayed
when they are back, so no accepted sample is lost across restarts either."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import orjson

from services.ingest.capture.private_files import private_dir, private_file
from services.ingest.capture.spill_contents import SpillLedger
from services.ingest.config import IngestSettings
from shared.processes import Incarnation, this_incarnation
from shared.settings import Settings

log = logging.getLogger("tuneloop.ingest.capture")


class SpillFile:
    """An append-only JSONL file of records that could not be processed yet, capped in size.

    Replay claims the file (renames it aside, so new records go to a fresh one) and reads the
    claimed file as a stream. The cap counts the live file and every claimed one: past it a new
    record is refused (`append` returns False) and the caller counts it; a record written back
    while a claimed file is being replayed (`readmitting`) takes the place of the one it came
    from and is never refused. The service process and its shipper share one data directory and
    so one spill file; a claim is named after the incarnation that made it, and one whose maker
    is gone is replayed by whoever finds it."""

    def __init__(
        self, path: Path, *, max_bytes: int = 1024**3, ledger: SpillLedger | None = None
    ) -> None:
        self.path = path
        self.max_bytes = max_bytes
        # Whose records went in since the file was last empty (spill_contents.py); None: not told.
        self.ledger = ledger
        private_dir(path.parent)
        self._used = 0  # bytes of the live file and the claimed ones, at the last look
        self._looked_at = -1.0

    def append(self, kind: str, payload: dict[str, Any], *, tenant: str | None = None) -> bool:
        """Keep the record; False (nothing written) when the file is at its cap. `tenant`'s
        record is counted in the ledger, kept or refused, unless a replay writes it back."""
        line = orjson.dumps({"kind": kind, "payload": payload}) + b"\n"
        readmitted = _readmitting.get()
        kept = readmitted or self.used() + len(line) <= self.max_bytes
        if kept:
            # One write per record and a flush: a killed process leaves whole lines behind.
            with private_file(self.path) as handle:
                handle.write(line)
                handle.flush()
            self._used += len(line)
        if self.ledger is not None and tenant is not None and not readmitted:
            self.ledger.count(tenant, len(line), kept=kept)
        return kept

    def used(self) -> int:
        """Bytes held, live file and claims; looked up again at most every half second (the
        other process sharing the file appends too)."""
        now = time.monotonic()
        if now - self._looked_at > 0.5:
            self._used = sum(_size(path) for path in self.files())
            self._looked_at = now
        return self._used

    def pending(self) -> bool:
        return _size(self.path) > 0 or any(self._claimed())

    def files(self) -> list[Path]:
        """The live file and every claimed one (what waits to be replayed)."""
        return [self.path, *self._all_claims()]

    def _all_claims(self) -> list[Path]:
        return sorted(self.path.parent.glob(self.path.name + CLAIM_INFIX + "*"))

    def _claimed(self) -> list[Path]:
        """Files claimed by this process, or by one that is gone (killed before it finished
        replaying them). A claim of the live process sharing the file is its own to replay."""
        mine = this_incarnation()
        claimed = []
        for path in self._all_claims():
            owner = claim_owner(path)
            if owner is None or owner == mine or not owner.alive():
                claimed.append(path)
        return claimed

    def claim(self) -> list[Path]:
        """Move the current file aside (new records go to a fresh one) and return every claimed file."""
        if _size(self.path) > 0:
            aside = f"{self.path.name}{CLAIM_INFIX}{this_incarnation().name}-{time.time_ns()}"
            with contextlib.suppress(FileNotFoundError):  # the other process claimed it first
                self.path.rename(self.path.with_name(aside))
        return self._claimed()

    @staticmethod
    def records(claimed: Path) -> Iterator[dict[str, Any]]:
        """The claimed file's records, read as a stream; a torn last line (a crash) is skipped."""
        try:
            handle = claimed.open("rb")
        except FileNotFoundError:  # a dead owner's claim, replayed by the other process just now
            return
        with handle:
            for line in handle:
                with contextlib.suppress(orjson.JSONDecodeError):
                    yield orjson.loads(line)

    @staticmethod
    @contextlib.contextmanager
    def readmitting() -> Iterator[None]:
        """Records appended inside this block (and the tasks it starts) are being written back
        by a replay: they are never refused for the cap."""
        token = _readmitting.set(True)
        try:
            yield
        finally:
            _readmitting.reset(token)


def spill_file(settings: Settings, ingest: IngestSettings) -> SpillFile:
    """The spill file of a data directory (the service's and its shipper's)."""
    path = settings.app.data_dir.resolve() / "ingest" / "capture-spill.jsonl"
    return SpillFile(path, max_bytes=ingest.spill_max_bytes, ledger=SpillLedger.beside(path))


CLAIM_INFIX = ".replaying-"
_readmitting: ContextVar[bool] = ContextVar("spill_readmitting", default=False)


def claim_owner(path: Path) -> Incarnation | None:
    """Who claimed a spill file (`<spill>.replaying-<incarnation>-<ns>`); None for a claim
    named by an earlier version (by pid only), whose maker is gone."""
    owner = path.name.rpartition(CLAIM_INFIX)[2].rpartition("-")[0]
    return Incarnation.parse(owner)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0

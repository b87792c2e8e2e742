"""What capture works on: a proxied call as bytes, how it is read, the spill file, the counts.

The gateway journals each call it answered (journal.py); the shipper process reads the journal
and hands the calls to the capture pipeline (pipeline.py), which normalises, scrubs, moves media
and oversized samples to object storage and publishes `sample.captured`. Whatever cannot be
published now (NATS or S3 away) goes to the spill file (`SpillFile`, capped) and is replayed
when they return, so no accepted sample is lost across restarts either.
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import logging
import time
import zlib
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple

import orjson

from services.ingest.capture.private_files import private_dir, private_file
from services.ingest.capture.spill_contents import SpillLedger
from services.ingest.config import IngestSettings
from services.ingest.gateway.routing import Api
from services.ingest.normalize import Exchange, NormalizeError
from shared.bus import EncodedEvent
from shared.chat import derive_sample_id
from shared.events import SampleCaptured
from shared.processes import Incarnation, this_incarnation
from shared.settings import Settings

log = logging.getLogger("tuneloop.ingest.capture")

Publish = Callable[[SampleCaptured], Awaitable[None]]
# Publishes encoded events together; each one's outcome in order, None when it was stored.
PublishMany = Callable[[list[EncodedEvent]], Awaitable[list[BaseException | None]]]


@dataclass
class CapturedCall:
    """One proxied call, as bytes, before any parsing (parsing is the workers' job)."""

    api: Api
    tenant: str
    request_id: str
    request_body: bytes
    status: int
    response_body: bytes  # as received from upstream, still content-encoded
    content_type: str
    content_encoding: str
    started_at: datetime
    latency_ms: float
    ttft_ms: float | None = None
    model_from_path: str | None = None
    tags: list[str] = field(default_factory=list)
    # The API path called (normalize.Exchange.api_path); "" in journal lines written before it.
    path: str = ""

    def to_record(self) -> dict[str, Any]:
        # Field by field, not dataclasses.asdict: that deep-copies every value, and this runs
        # for every proxied call (the journal line).
        return {
            "api": self.api,
            "tenant": self.tenant,
            "request_id": self.request_id,
            "request_body": base64.b64encode(self.request_body).decode(),
            "status": self.status,
            "response_body": base64.b64encode(self.response_body).decode(),
            "content_type": self.content_type,
            "content_encoding": self.content_encoding,
            "started_at": self.started_at.isoformat(),
            "latency_ms": self.latency_ms,
            "ttft_ms": self.ttft_ms,
            "model_from_path": self.model_from_path,
            "tags": self.tags,
            "path": self.path,
        }

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> CapturedCall:
        return cls(
            **{
                **record,
                "request_body": base64.b64decode(record["request_body"]),
                "response_body": base64.b64decode(record["response_body"]),
                "started_at": datetime.fromisoformat(record["started_at"]),
            }
        )


def gateway_sample_id(tenant: str, request_id: str) -> str:
    """The id of the sample a captured call becomes, known before the call is read: `Sample`
    derives it from (tenant, source, source_ref = the call's request id, choice index), so the
    gateway can tell the caller (`x-tuneloop-sample-id`) while the answer goes out. It is the
    first choice's; an OpenAI call with `n` > 1 makes one sample per choice."""
    return derive_sample_id(tenant, "gateway", request_id)


def decode_body(raw: bytes, encoding: str) -> bytes:
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return raw
    if encoding == "gzip":
        return gzip.decompress(raw)
    if encoding == "deflate":
        return zlib.decompress(raw)
    raise ValueError(f"content-encoding {encoding!r} is not supported for capture")


def to_exchange(call: CapturedCall) -> Exchange:
    """Parse the bytes of a call into an Exchange; NormalizeError names what is unreadable."""
    try:
        request = orjson.loads(call.request_body)
    except orjson.JSONDecodeError as exc:
        raise NormalizeError("request", f"body is not JSON ({exc})") from None
    if not isinstance(request, dict):
        raise NormalizeError("request", "body is not a JSON object")
    try:
        body = decode_body(call.response_body, call.content_encoding)
    except (ValueError, OSError, zlib.error) as exc:
        raise NormalizeError("response", str(exc)) from None
    text = body.decode("utf-8", "replace")
    if call.content_type.startswith("text/event-stream"):
        return _exchange(call, request, None, text)
    try:
        parsed = orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        parsed = None
    if isinstance(parsed, list) and call.api == "gemini":
        # streamGenerateContent without alt=sse answers one JSON array of chunks.
        return _exchange(call, request, None, text)
    return _exchange(
        call, request, parsed if isinstance(parsed, dict) else {"raw": text[:2000]}, None
    )


def _exchange(
    call: CapturedCall, request: dict[str, Any], response: dict[str, Any] | None, stream: str | None
) -> Exchange:
    return Exchange(
        provider=call.api,
        request=request,
        status=call.status,
        response=response,
        stream=stream,
        model_from_path=call.model_from_path,
        api_path=call.path or None,
        tenant=call.tenant,
        source="gateway",
        source_ref=call.request_id,
        created_at=call.started_at,
        latency_ms=call.latency_ms,
        time_to_first_token_ms=call.ttft_ms,
        tags=call.tags,
    )


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
        # Whose records went in since the file was last empty (spilling.py); None: not told.
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


_MAX_REASONS = 10_000


class FidelityDelta(NamedTuple):
    tenant: str
    source: str
    kind: str  # samples | rejected | dropped
    reason: str  # "" for samples
    added: int  # (not `count`: a tuple's own method)


@dataclass
class Fidelity:
    """What each source made of its input: samples, and what was rejected or dropped, by reason.

    Counted in this process since the last `drain`; fidelity.py adds the drained counts to the
    database's totals every few seconds, and `report` gives one tenant's unflushed view.
    """

    samples: Counter[tuple[str, str]] = field(default_factory=Counter)
    rejected: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    dropped: Counter[tuple[str, str, str]] = field(default_factory=Counter)

    def count_sample(self, tenant: str, source: str) -> None:
        self.samples[(tenant, source)] += 1

    def count_rejected(self, tenant: str, source: str, reason: str) -> None:
        self._count(self.rejected, tenant, source, reason)

    def count_dropped(self, tenant: str, source: str, reason: str) -> None:
        self._count(self.dropped, tenant, source, reason)

    @staticmethod
    def _count(
        counter: Counter[tuple[str, str, str]], tenant: str, source: str, reason: str
    ) -> None:
        # Reasons can quote input (an unknown key's name); past a bound, they share one bucket.
        key = (tenant, source, reason[:200])
        if key not in counter and len(counter) >= _MAX_REASONS:
            key = (tenant, source, "(other reasons)")
        counter[key] += 1

    def drain(self) -> list[FidelityDelta]:
        """Every count as (tenant, source, kind, reason, n), and start again from zero."""
        deltas = [FidelityDelta(t, s, "samples", "", n) for (t, s), n in self.samples.items()]
        for kind, counter in (("rejected", self.rejected), ("dropped", self.dropped)):
            deltas += [FidelityDelta(t, s, kind, r, n) for (t, s, r), n in counter.items()]
        self.samples, self.rejected, self.dropped = Counter(), Counter(), Counter()
        return deltas

    def restore(self, deltas: list[FidelityDelta]) -> None:
        """Put drained counts back (their flush failed), so none is lost."""
        for d in deltas:
            if d.kind == "samples":
                self.samples[(d.tenant, d.source)] += d.added
            else:
                counter = self.rejected if d.kind == "rejected" else self.dropped
                counter[(d.tenant, d.source, d.reason)] += d.added

    def report(self, tenant: str) -> dict[str, Any]:
        sources = {source for (t, source) in self.samples if t == tenant}
        sources |= {source for (t, source, _) in (*self.rejected, *self.dropped) if t == tenant}
        return {
            source: {
                "samples": self.samples[(tenant, source)],
                "rejected": {
                    r: n for (t, s, r), n in self.rejected.items() if (t, s) == (tenant, source)
                },
                "dropped": {
                    r: n for (t, s, r), n in self.dropped.items() if (t, s) == (tenant, source)
                },
            }
            for source in sorted(sources)
        }

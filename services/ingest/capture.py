"""Capture off the hot path: captured calls become samples and events after the response is sent.

`submit` never blocks and never fails the user's call: a call goes into a bounded queue, or, when
the queue is full, straight to the spill file. Workers normalise, move media to object storage
and publish `sample.captured` on JetStream (the event id is the sample id, so a replayed sample
is stored once). Whatever cannot be published now (NATS or S3 away) is appended to the spill
file and replayed when they return, so no accepted sample is lost across restarts either.
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import logging
import os
import time
import zlib
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple

import orjson

from services.ingest.normalize import Exchange, NormalizeError
from services.ingest.routing import Api
from shared.bus import EncodedEvent
from shared.events import SampleCaptured
from shared.processes import pid_alive

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

    return True


class SpillFile:
    """An append-only JSONL file of records that could not be processed yet."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def append(self, kind: str, payload: dict[str, Any]) -> None:
        line = orjson.dumps({"kind": kind, "payload": payload}) + b"\n"
        # One write per record and a flush: a killed process leaves whole lines behind.
        with self.path.open("ab") as handle:
            handle.write(line)
            handle.flush()

    def pending(self) -> bool:
        return (self.path.exists() and self.path.stat().st_size > 0) or any(self._claimed())

    def _claimed(self) -> list[Path]:
        """Files claimed by this process, or by one that died before replaying them. With several
        worker processes on one data dir, a live sibling's claim is its own to replay."""
        mine = str(os.getpid())
        claimed = []
        for path in sorted(self.path.parent.glob(self.path.name + ".replaying-*")):
            owner = path.name.rsplit(".replaying-", 1)[1].partition("-")[0]
            if owner == mine or not (owner.isdigit() and pid_alive(int(owner))):
                claimed.append(path)
        return claimed

    def claim(self) -> list[Path]:
        """Move the current file aside (new records go to a fresh one) and return every claimed file."""
        if self.path.exists() and self.path.stat().st_size > 0:
            aside = f"{self.path.name}.replaying-{os.getpid()}-{time.time_ns()}"
            with contextlib.suppress(FileNotFoundError):  # a sibling process claimed it first
                self.path.rename(self.path.with_name(aside))
        return self._claimed()

    @staticmethod
    def records(claimed: Path) -> list[dict[str, Any]]:
        records = []
        try:
            data = claimed.read_bytes()
        except FileNotFoundError:  # a dead owner's claim, replayed by a sibling just now
            return []
        for line in data.splitlines():
            with contextlib.suppress(orjson.JSONDecodeError):  # a torn last line from a crash
                records.append(orjson.loads(line))
        return records


_MAX_REASONS = 10_000


class FidelityDelta(NamedTuple):
    tenant: str
    source: str
    kind: str  # samples | rejected | dropped
    reason: str  # "" for samples
    count: int


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
                self.samples[(d.tenant, d.source)] += d.count
            else:
                counter = self.rejected if d.kind == "rejected" else self.dropped
                counter[(d.tenant, d.source, d.reason)] += d.count

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

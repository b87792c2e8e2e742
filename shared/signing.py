"""HMAC-SHA256 signatures of webhook bodies (trainer → scheduler reports) with timestamp and nonce.

The sender signs `f"{timestamp}.{nonce}.".encode() + body` and sends three headers; the receiver
refuses a report that is unsigned, tampered with, outside the time tolerance, or replayed. Replay
detection remembers each nonce until its timestamp leaves the tolerance window: in memory for one
process, or in the `auth_webhook_nonces` table so every scheduler replica sees the same nonces.
"""

from __future__ import annotations

import hashlib
import heapq
import hmac
import re
import secrets
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from sqlalchemy import delete, insert
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlmodel import Field, SQLModel, col

from shared.db import UTCDateTime

TIMESTAMP_HEADER = "X-Tuneloop-Timestamp"
NONCE_HEADER = "X-Tuneloop-Nonce"
SIGNATURE_HEADER = "X-Tuneloop-Signature"
SCHEME = "v1"
DEFAULT_TOLERANCE_S = 300

_TIMESTAMP = re.compile(r"\d{1,12}")
_NONCE = re.compile(r"[A-Za-z0-9_-]{16,128}")
_SIGNATURE = re.compile(r"[0-9a-f]{64}")


class SignatureError(Exception):
    """A webhook was refused; the message says why (safe to return: it holds no secret)."""


class MissingHeaderError(SignatureError):
    def __init__(self, header: str) -> None:
        super().__init__(f"missing header {header}")
        self.header = header


class MalformedHeaderError(SignatureError):
    pass


class StaleTimestampError(SignatureError):
    pass


class FutureTimestampError(SignatureError):
    pass


class BadSignatureError(SignatureError):
    pass


class ReplayedNonceError(SignatureError):
    pass


class NonceStoreFullError(SignatureError):
    """The in-memory store is full of unexpired nonces; refusing beats forgetting (replay hole)."""


@dataclass(frozen=True)
class VerifiedWebhook:
    timestamp: int
    nonce: str


class NonceStore(Protocol):
    def remember(self, nonce: str, *, expires_at: float, now: float) -> bool:
        """Record `nonce` until `expires_at` (Unix seconds); False if it is already recorded."""
        ...


def _digest(secret: str, timestamp: int, nonce: str, body: bytes) -> str:
    message = f"{timestamp}.{nonce}.".encode() + body
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def sign(
    body: bytes, secret: str, *, timestamp: int | None = None, nonce: str | None = None
) -> dict[str, str]:
    """The headers that authenticate `body`; send them with exactly these bytes."""
    if not secret:
        raise ValueError("secret: must not be empty")
    timestamp = int(time.time()) if timestamp is None else timestamp
    nonce = secrets.token_hex(16) if nonce is None else nonce
    if not _NONCE.fullmatch(nonce):
        raise ValueError("nonce: must be 16-128 characters of A-Z, a-z, 0-9, '_' or '-'")
    return {
        TIMESTAMP_HEADER: str(timestamp),
        NONCE_HEADER: nonce,
        SIGNATURE_HEADER: f"{SCHEME}={_digest(secret, timestamp, nonce, body)}",
    }


def _parse(headers: Mapping[str, str]) -> tuple[int, str, list[str]]:
    lowered = {name.lower(): value.strip() for name, value in headers.items()}
    values = []
    for header in (TIMESTAMP_HEADER, NONCE_HEADER, SIGNATURE_HEADER):
        value = lowered.get(header.lower())
        if not value:
            raise MissingHeaderError(header)
        values.append(value)
    raw_timestamp, nonce, raw_signature = values
    if not _TIMESTAMP.fullmatch(raw_timestamp):
        raise MalformedHeaderError(
            f"{TIMESTAMP_HEADER} must be whole Unix seconds (got {raw_timestamp[:40]!r})"
        )
    if not _NONCE.fullmatch(nonce):
        raise MalformedHeaderError(
            f"{NONCE_HEADER} must be 16-128 characters of A-Z, a-z, 0-9, '_' or '-'"
        )
    # Several `v1=` entries are allowed, so a sender can sign with old and new secret mid-rotation.
    signatures = [
        value
        for scheme, _, value in (part.strip().partition("=") for part in raw_signature.split(","))
        if scheme == SCHEME and _SIGNATURE.fullmatch(value)
    ]
    if not signatures:
        raise MalformedHeaderError(
            f"{SIGNATURE_HEADER} must look like {SCHEME}=<64 hex characters>"
        )
    return int(raw_timestamp), nonce, signatures


def _check_timestamp(timestamp: int, *, now: float, tolerance_s: float) -> None:
    skew = now - timestamp
    if skew > tolerance_s:
        raise StaleTimestampError(
            f"{TIMESTAMP_HEADER} is {skew:.0f}s old, beyond the {tolerance_s:g}s tolerance"
        )
    if -skew > tolerance_s:
        raise FutureTimestampError(
            f"{TIMESTAMP_HEADER} is {-skew:.0f}s in the future, beyond the {tolerance_s:g}s "
            "tolerance (check the sender's clock)"
        )


def verify(
    headers: Mapping[str, str],
    body: bytes,
    secret: str | Sequence[str],
    *,
    nonce_store: NonceStore,
    tolerance_s: float = DEFAULT_TOLERANCE_S,
    now: float | None = None,
) -> VerifiedWebhook:
    """Check a signed webhook; raise a SignatureError subclass saying what is wrong.

    `secret` may list several secrets (new first) so senders can move to a new one gradually.
    Header names are matched case-insensitively.
    """
    candidates = [secret] if isinstance(secret, str) else list(secret)
    if not candidates or not all(candidates):
        raise ValueError("secret: at least one non-empty secret is required")
    now = time.time() if now is None else now
    timestamp, nonce, signatures = _parse(headers)
    _check_timestamp(timestamp, now=now, tolerance_s=tolerance_s)
    expected = [_digest(candidate, timestamp, nonce, body) for candidate in candidates]
    if not any(hmac.compare_digest(e, s) for e in expected for s in signatures):
        raise BadSignatureError("signature does not match the body with any configured secret")
    # Only a correctly signed request may spend a nonce, or anyone could burn a sender's nonces.
    if not nonce_store.remember(nonce, expires_at=timestamp + tolerance_s, now=now):
        raise ReplayedNonceError(f"nonce {nonce} was already used: replayed request")
    return VerifiedWebhook(timestamp=timestamp, nonce=nonce)


class MemoryNonceStore:
    """Nonces of one process, forgotten once expired; at most `max_entries` unexpired ones."""

    def __init__(self, max_entries: int = 100_000) -> None:
        self._max_entries = max_entries
        self._expiry: dict[str, float] = {}
        self._heap: list[tuple[float, str]] = []  # (expires_at, nonce), soonest first
        self._lock = threading.Lock()  # FastAPI runs sync routes on a thread pool

    def __len__(self) -> int:
        return len(self._expiry)

    def remember(self, nonce: str, *, expires_at: float, now: float) -> bool:
        with self._lock:
            while self._heap and self._heap[0][0] < now:
                _, expired = heapq.heappop(self._heap)
                self._expiry.pop(expired, None)
            if nonce in self._expiry:
                return False
            if len(self._expiry) >= self._max_entries:
                raise NonceStoreFullError(
                    f"nonce store holds {self._max_entries} unexpired nonces; refusing new ones "
                    "until some expire (use SqlNonceStore for this volume)"
                )
            self._expiry[nonce] = expires_at
            heapq.heappush(self._heap, (expires_at, nonce))
            return True


class WebhookNonce(SQLModel, table=True):
    __tablename__ = "auth_webhook_nonces"

    nonce: str = Field(primary_key=True, max_length=128)
    expires_at: datetime = Field(sa_type=UTCDateTime, index=True)


def _at(unix_s: float) -> datetime:
    return datetime.fromtimestamp(unix_s, UTC)


class SqlNonceStore:
    """Nonces in the shared database: the primary key turns a replay into an insert that fails,
    in whichever process or replica it arrives."""

    def __init__(self, engine: Engine, *, purge_every_s: float = 60.0) -> None:
        self._engine = engine
        self._purge_every_s = purge_every_s
        self._last_purge = float("-inf")

    def remember(self, nonce: str, *, expires_at: float, now: float) -> bool:
        if now - self._last_purge >= self._purge_every_s:
            self.purge(now=now)
        try:
            with self._engine.begin() as connection:
                connection.execute(
                    insert(WebhookNonce).values(nonce=nonce, expires_at=_at(expires_at))
                )
        except IntegrityError:
            return False
        return True

    def purge(self, *, now: float | None = None) -> int:
        """Delete expired nonces (their timestamps are refused anyway); returns how many."""
        now = time.time() if now is None else now
        self._last_purge = now
        with self._engine.begin() as connection:
            result = connection.execute(
                delete(WebhookNonce).where(col(WebhookNonce.expires_at) < _at(now))
            )
        return int(result.rowcount)

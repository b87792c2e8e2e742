"""The dead-letter stream: messages no consumer can ever handle, kept for an operator to list and replay.

A consumer that gives up on a message (an undecodable or invalid event, a handler's
`PermanentError`) copies it to TUNELOOP_DEADLETTERS on `tuneloop.<tenant>.deadletter.<rest of
the original subject>` (the tenant token stays, so NATS permissions scope it as they scope the
original), with headers naming where it came from and why, and terminates the original only once
the copy is stored. `tuneloop deadletters list|replay` (shared.dev.cli) call `list_dead_letters` and
`replay`: a replay republishes the payload and the original headers to the original subject and
then deletes the copy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

import nats
import nats.js.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from shared.events import DEADLETTERS, SUBJECT_ROOT, SYSTEM_TENANT
from shared.settings import NatsSettings

HEADER_PREFIX = "tuneloop-deadletter-"
ORIGINAL_SUBJECT = HEADER_PREFIX + "subject"
ORIGINAL_STREAM = HEADER_PREFIX + "stream"
ORIGINAL_SEQUENCE = HEADER_PREFIX + "sequence"
ORIGINAL_MSG_ID = HEADER_PREFIX + "msg-id"
CONSUMER = HEADER_PREFIX + "consumer"
REASON = HEADER_PREFIX + "reason"
DEAD_AT = HEADER_PREFIX + "at"
DELIVERIES = HEADER_PREFIX + "deliveries"
MSG_ID = "Nats-Msg-Id"
# A reason quotes an exception; headers are one line and travel with every list.
MAX_REASON_CHARS = 1_000
_ALL = f"{SUBJECT_ROOT}.*.{DEADLETTERS.domain}.>"


def subject_for(original: str) -> str:
    """tuneloop.acme.sample.captured.v1 -> tuneloop.acme.deadletter.sample.captured.v1."""
    root, _, rest = original.partition(".")
    tenant, _, tail = rest.partition(".")
    if root != SUBJECT_ROOT or not tenant or not tail:
        return f"{SUBJECT_ROOT}.{SYSTEM_TENANT}.{DEADLETTERS.domain}.{original}"
    return f"{SUBJECT_ROOT}.{tenant}.{DEADLETTERS.domain}.{tail}"


def _one_line(text: str) -> str:
    return " ".join(text.split())[:MAX_REASON_CHARS]


def _origin(message: Msg) -> tuple[str, int, int]:
    """(stream, stream sequence, deliveries) of a JetStream message."""
    try:
        meta = message.metadata
        return meta.stream, int(meta.sequence.stream), int(meta.num_delivered)
    except Exception:  # not a JetStream message (FastStream's test broker): nothing to name
        return "", 0, 1


async def dead_letter(
    js: JetStreamContext,
    message: Msg,
    *,
    consumer: str,
    reason: str,
    payload: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout_s: float = 5.0,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> int:
    """Store a copy of `message` (or of `payload` with `headers`: part of a bundle) in the
    dead-letter stream and return its sequence there; raises when the stream did not ack it, and
    the caller must then not terminate the original."""
    stream, sequence, delivered = _origin(message)
    original = dict(message.headers or {}) if headers is None else dict(headers)
    original_id = original.pop(MSG_ID, "")
    copy = {key: value for key, value in original.items() if not key.startswith(HEADER_PREFIX)}
    copy |= {
        ORIGINAL_SUBJECT: message.subject,
        ORIGINAL_STREAM: stream,
        ORIGINAL_SEQUENCE: str(sequence),
        CONSUMER: consumer,
        REASON: _one_line(reason) or "(no reason given)",
        DEAD_AT: clock().isoformat(timespec="milliseconds"),
        DELIVERIES: str(delivered),
    }
    if original_id:
        copy[ORIGINAL_MSG_ID] = original_id
    if sequence:  # a copy stored but not followed by the term is stored once when retried
        copy[MSG_ID] = f"deadletter:{stream}:{sequence}:{consumer}"
    ack = await js.publish(
        subject_for(message.subject),
        message.data if payload is None else payload,
        timeout=timeout_s,
        stream=DEADLETTERS.name,
        headers=copy,
    )
    return int(ack.seq)


@dataclass(frozen=True)
class DeadLetter:
    """One stored dead letter, `seq` being its id in the dead-letter stream."""

    seq: int
    tenant: str
    subject: str  # the original subject, where a replay sends it
    stream: str
    sequence: int  # in the original stream
    consumer: str
    reason: str
    at: str
    deliveries: int
    size: int
    headers: dict[str, str]
    data: bytes


def _parse(raw: nats.js.api.RawStreamMsg) -> DeadLetter:
    headers = dict(raw.headers or {})
    subject = raw.subject or ""
    return DeadLetter(
        seq=int(raw.seq or 0),
        tenant=subject.split(".")[1] if subject.count(".") >= 2 else "",
        subject=headers.get(ORIGINAL_SUBJECT, ""),
        stream=headers.get(ORIGINAL_STREAM, ""),
        sequence=int(headers.get(ORIGINAL_SEQUENCE) or 0),
        consumer=headers.get(CONSUMER, ""),
        reason=headers.get(REASON, ""),
        at=headers.get(DEAD_AT, ""),
        deliveries=int(headers.get(DELIVERIES) or 0),
        size=len(raw.data or b""),
        headers=headers,
        data=raw.data or b"",
    )


def _filter(tenant: str | None) -> str:
    return _ALL if tenant is None else f"{SUBJECT_ROOT}.{tenant}.{DEADLETTERS.domain}.>"


async def list_dead_letters(
    js: JetStreamContext, *, tenant: str | None = None, limit: int = 100, after_seq: int = 0
) -> list[DeadLetter]:
    """Up to `limit` dead letters (of `tenant`, or all), oldest first, after `after_seq`."""
    found: list[DeadLetter] = []
    seq = after_seq + 1
    while len(found) < limit:
        try:
            raw = await js.get_msg(DEADLETTERS.name, seq=seq, subject=_filter(tenant), next=True)
        except nats.js.errors.NotFoundError:
            break
        letter = _parse(raw)
        found.append(letter)
        seq = letter.seq + 1
    return found


class UnknownDeadLetter(LookupError):
    """No dead letter has this sequence (never stored, replayed, or aged out)."""


async def replay_one(js: JetStreamContext, seq: int, *, timeout_s: float = 5.0) -> DeadLetter:
    """Republish one dead letter to its original subject (payload and original headers), then
    delete it from the dead-letter stream. A replay cut off between the two is stored once when
    repeated within the original stream's duplicate window."""
    try:
        letter = _parse(await js.get_msg(DEADLETTERS.name, seq=seq))
    except nats.js.errors.NotFoundError:
        raise UnknownDeadLetter(f"dead letter {seq}: not in {DEADLETTERS.name}") from None
    if not letter.subject:
        raise UnknownDeadLetter(f"dead letter {seq}: no {ORIGINAL_SUBJECT} header to replay to")
    headers = {
        key: value
        for key, value in letter.headers.items()
        if not key.startswith(HEADER_PREFIX) and not key.startswith("Nats-")
    }
    # A fresh id: the original's may still be in the stream's duplicate window, which would
    # take the replay for a duplicate and drop it.
    original_id = letter.headers.get(ORIGINAL_MSG_ID) or f"{letter.stream}:{letter.sequence}"
    headers[MSG_ID] = f"{original_id}:replay:{seq}"
    await js.publish(
        letter.subject, letter.data, timeout=timeout_s, stream=letter.stream or None,
        headers=headers,
    )  # fmt: skip
    await js.delete_msg(DEADLETTERS.name, seq)
    return letter


async def replay(js: JetStreamContext, seqs: Iterable[int]) -> list[DeadLetter]:
    """`replay_one` for each sequence, in order; stops at the first that fails."""
    return [await replay_one(js, seq) for seq in seqs]


async def replay_every(js: JetStreamContext, *, tenant: str | None = None) -> list[DeadLetter]:
    """Replay every dead letter (of `tenant`, or all) present when the call starts."""
    # A replayed message that fails again comes back later in the stream; not in this pass.
    last = (await js.stream_info(DEADLETTERS.name)).state.last_seq
    replayed: list[DeadLetter] = []
    after = 0
    while batch := await list_dead_letters(js, tenant=tenant, limit=100, after_seq=after):
        for letter in batch:
            if letter.seq > last:
                return replayed
            replayed.append(await replay_one(js, letter.seq))
        after = batch[-1].seq
    return replayed


# --- the operator's commands (`tuneloop deadletters ...`) -------------------------------------


async def operator_list(
    settings: NatsSettings, *, tenant: str | None, limit: int
) -> list[DeadLetter]:
    connection = await nats.connect(settings.url, connect_timeout=2, max_reconnect_attempts=0)
    try:
        return await list_dead_letters(connection.jetstream(), tenant=tenant, limit=limit)
    finally:
        await connection.close()


async def operator_replay(
    settings: NatsSettings, seqs: list[int], *, replay_all: bool, tenant: str | None
) -> list[int]:
    """The ids replayed: `seqs`, or with `replay_all` every one (of `tenant`)."""
    connection = await nats.connect(settings.url, connect_timeout=2, max_reconnect_attempts=0)
    try:
        js = connection.jetstream()
        done = await replay_every(js, tenant=tenant) if replay_all else await replay(js, seqs)
        return [letter.seq for letter in done]
    finally:
        await connection.close()

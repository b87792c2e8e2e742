"""The NATS bus through FastStream: broker factory, start-up readiness, streams, typed publish/subscribe.

Publishers and subscribers take an event *class* from shared.events, never a subject string, so
producer and consumer cannot drift apart. JetStream events are published with the event id as
`Nats-Msg-Id`, so a retried publish inside the stream's duplicate window is stored once.
`consume_batches` is the high-volume alternative to `subscribe`: the same durable consumer,
pulled in batches with nats-py, for handlers that gain from doing many events at once. Events
of a `bundled` class (sample.captured) may travel several to a message (`publish_many` makes
such bundles, `consume_batches` opens them): a JetStream message costs ~150 us of client and
server CPU, more than a captured sample's own bytes. Both consumption paths retry a recoverable
fault for as long as it lasts and dead-letter a message that can never be handled (see
shared.redelivery and docs/bus.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import inspect
import logging
import weakref
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from urllib.parse import urlsplit

import nats.errors
import nats.js.errors
import pydantic_core
from faststream.exceptions import IncorrectState
from faststream.middlewares import AckPolicy
from faststream.nats import ConsumerConfig, DeliverPolicy, JStream, NatsBroker, NatsRouter, PullSub
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig
from tenacity import AsyncRetrying, RetryError, stop_after_delay, wait_exponential

from shared import redelivery
from shared.events import STREAMS, Event, Stream
from shared.redelivery import PermanentError as PermanentError  # handlers raise bus.PermanentError
from shared.redelivery import RetryPolicy as RetryPolicy
from shared.settings import NatsSettings

log = logging.getLogger("tuneloop.bus")

E = TypeVar("E", bound=Event)
Handler = Callable[..., Any]

# JetStream's error code for "a stream with this name exists with a different configuration".
_STREAM_NAME_IN_USE = 10058
_SECONDS_PER_DAY = 86_400
# A bundle's header: how many events its payload holds, one JSON document a line.
BUNDLE_HEADER = "tuneloop-bundle"
# Bundles stay well under every stream's message limit and keep a consumer's fetch of a few
# dozen messages to tens of MiB; an event larger than this travels alone.
MAX_BUNDLE_BYTES = 1024 * 1024


class BusUnavailable(RuntimeError):
    """NATS could not be reached within the start-up deadline."""


def make_broker(settings: NatsSettings, *, service: str) -> NatsBroker:
    """A broker that reconnects forever and says so in the log, for one service process."""
    url = settings.url
    wait_s = 1

    async def disconnected() -> None:
        connection = broker.connection
        if connection is not None and connection.is_closed:
            return  # our own shutdown (drain, then close), not an outage
        log.warning(
            "NATS connection to %s lost; reconnecting every %ds until it returns", url, wait_s
        )

    async def reconnected() -> None:
        log.warning("NATS reconnected to %s; consumers resume", url)

    async def error(exc: Exception) -> None:
        log.warning("NATS client error (%s): %s", type(exc).__name__, exc)

    broker = NatsBroker(
        url,
        name=f"tuneloop-{service}",
        allow_reconnect=True,
        max_reconnect_attempts=-1,
        reconnect_time_wait=wait_s,
        connect_timeout=2,
        disconnected_cb=disconnected,
        reconnected_cb=reconnected,
        error_cb=error,
        # Samples are published while the server is away; keep up to 64 MiB of them buffered.
        pending_size=64 * 1024**2,
        graceful_timeout=10.0,
        logger=logging.getLogger(f"tuneloop.{service}.faststream"),
        # Per-message "Received/Processed" lines only at DEBUG: heartbeats alone would flood INFO.
        log_level=logging.DEBUG,
    )
    return broker


async def _probe(url: str) -> None:
    """A NATS server greets every TCP client with INFO; check that before the client connects.

    nats-py retries an initial connection forever when reconnects are unlimited, so the bounded
    start-up wait has to happen here, outside it.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("nats", "tls"):
        return  # websocket servers greet after the HTTP upgrade; let the client find out
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(parts.hostname or "127.0.0.1", parts.port or 4222), timeout=2.0
    )
    try:
        greeting = await asyncio.wait_for(reader.readline(), timeout=2.0)
    finally:
        writer.close()
    if not greeting.startswith(b"INFO"):
        raise ConnectionError(f"{parts.hostname}:{parts.port} answered, but not as a NATS server")


async def connect(broker: NatsBroker, settings: NatsSettings) -> None:
    """Connect with a bounded retry, then fail with one clear line."""
    try:
        async for attempt in AsyncRetrying(
            stop=stop_after_delay(settings.connect_timeout_s),
            wait=wait_exponential(multiplier=0.2, max=2.0),
            reraise=False,
        ):
            with attempt:
                await _probe(settings.url)
                await asyncio.wait_for(
                    broker.connect(), timeout=max(settings.connect_timeout_s, 5.0)
                )
    except RetryError as exc:
        reason = exc.last_attempt.exception()
        raise BusUnavailable(
            f"NATS at {settings.url} unreachable after {settings.connect_timeout_s:.0f}s: "
            f"{type(reason).__name__}: {reason}"
        ) from None


def stream_config(stream: Stream, settings: NatsSettings) -> StreamConfig:
    max_age_days = stream.max_age_days or settings.stream_max_age_days
    return StreamConfig(
        name=stream.name,
        description=stream.description,
        subjects=stream.subjects,
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        discard=DiscardPolicy.OLD,
        max_age=max_age_days * _SECONDS_PER_DAY,
        max_bytes=settings.stream_max_bytes,
        max_msg_size=stream.max_msg_size,
        duplicate_window=stream.duplicate_window_s,
    )


async def declare_streams(connection: NatsClient, settings: NatsSettings) -> None:
    """Create every stream, or bring an existing one to the declared limits, and every durable
    consumer `subscribe` declared in this process to its config. Safe to run concurrently. A
    server that cannot carry a stream's largest message is named in the log."""
    check_payload_limit(connection, settings)
    js = connection.jetstream()
    for stream in STREAMS:
        config = stream_config(stream, settings)
        try:
            await js.add_stream(config)
        except nats.js.errors.BadRequestError as exc:
            if exc.err_code != _STREAM_NAME_IN_USE:
                raise
            await js.update_stream(config)
    await redelivery.update_declared_consumers(js)


def check_payload_limit(connection: NatsClient, settings: NatsSettings) -> bool:
    """Whether the server takes messages as large as every stream allows; if not, says so at
    ERROR with the setting to change. nats-server's default payload limit (1 MB) is below the
    samples stream's 8 MB and is set only in its config file: on such a server a larger sample
    is refused by the client, kept in the spill file, and refused again at every replay."""
    needed = max(STREAMS, key=lambda stream: stream.max_msg_size)
    if connection.max_payload >= needed.max_msg_size:
        return True
    log.error(
        "NATS at %s takes messages of at most %d bytes, less than stream %s allows (%d): "
        "larger events are refused and samples among them wait in the spill file. Set "
        "`max_payload: %d` in the server's config (the local stack's nats.conf does).",
        urlsplit(settings.url).netloc.rpartition("@")[2],  # host:port, never credentials
        connection.max_payload,
        needed.name,
        needed.max_msg_size,
        needed.max_msg_size,
    )
    return False


async def publish(broker: NatsBroker, event: Event, *, timeout_s: float = 5.0) -> None:
    """Publish an event on its own subject; JetStream events wait (up to `timeout_s`) for the
    stream's ack and raise when it does not come, so the caller can keep the event elsewhere."""
    headers = {"tuneloop-event": type(event).__name__, "tuneloop-schema": str(event.schema_version)}
    # The event id doubles as FastStream's correlation id: it saves a uuid4 (a getrandom
    # syscall) per message on the capture hot path and ties the message to its event in logs.
    if event.stream is None:
        await broker.publish(
            event, subject=event.subject, headers=headers, correlation_id=event.event_id
        )
        return
    headers["Nats-Msg-Id"] = event.event_id
    await broker.publish(
        event,
        subject=event.subject,
        headers=headers,
        correlation_id=event.event_id,
        stream=event.stream.name,
        timeout=timeout_s,
    )


# One JetStream context per connection: its async-publish reply inbox is a subscription, made
# once, not per batch.
_publish_contexts: weakref.WeakKeyDictionary[NatsClient, JetStreamContext] = (
    weakref.WeakKeyDictionary()
)


def _headers(event: Event) -> dict[str, str]:
    """What `publish` sends, FastStream's own headers included, so its subscribers read the
    messages `publish_many` sends as their own."""
    return {
        "content-type": "application/json",
        "correlation_id": event.event_id,
        "tuneloop-event": type(event).__name__,
        "tuneloop-schema": str(event.schema_version),
        "Nats-Msg-Id": event.event_id,
    }


@dataclass(frozen=True, slots=True)
class EncodedEvent:
    """A JetStream event already serialised, as `publish_many` would send it: made where the
    event is built (an OTLP decoding process) so the process that publishes only sends bytes."""

    subject: str
    stream: str
    event_id: str
    headers: dict[str, str]
    payload: bytes
    bundled: bool = False  # its class's `Event.bundled`

    def __reduce__(self) -> tuple[type[EncodedEvent], tuple[Any, ...]]:
        # Pickled by the dozen per OTLP export on its way back from a mapping process: the
        # dataclass default (__getstate__/__setstate__ walking fields()) cost ~4 us an object.
        return type(self), (
            self.subject, self.stream, self.event_id, self.headers, self.payload, self.bundled
        )  # fmt: skip


def encode(event: Event, *, exclude_none: bool = False) -> EncodedEvent:
    """The event as `publish_many` sends it; ValueError for an event of no stream.
    `exclude_none` leaves out fields that are None (only for an event whose None fields all
    default to None, so a reader gets the same event back)."""
    if event.stream is None:
        raise ValueError(f"{type(event).__name__} is not a JetStream event")
    return EncodedEvent(
        event.subject,
        event.stream.name,
        event.event_id,
        _headers(event),
        pydantic_core.to_json(event, exclude_none=exclude_none),
        type(event).bundled,
    )


def bundles(
    events: Sequence[EncodedEvent], *, max_bytes: int = MAX_BUNDLE_BYTES
) -> list[tuple[EncodedEvent, list[int]]]:
    """The messages that carry `events`, each with the positions of the events it holds, in
    order. Bundled events of one subject share messages of up to `max_bytes` (their JSON
    documents a line each: compact JSON holds no raw newline); any other event, or one as large
    as a bundle, is a message of its own. A bundle's message id is derived from its events'
    ids, so sending the same bundle again inside the duplicate window stores it once."""
    messages: list[tuple[EncodedEvent, list[int]]] = []
    open_bundles: dict[str, tuple[list[int], int]] = {}  # subject -> (positions, bytes)

    def close(subject: str) -> None:
        positions, _ = open_bundles.pop(subject)
        messages.append((_bundle([events[i] for i in positions]), positions))

    for i, event in enumerate(events):
        size = len(event.payload) + 1
        if not event.bundled or size >= max_bytes:
            messages.append((event, [i]))
            continue
        positions, used = open_bundles.get(event.subject, ([], 0))
        if used + size > max_bytes:
            close(event.subject)
            positions, used = [], 0
        positions.append(i)
        open_bundles[event.subject] = (positions, used + size)
    for subject in list(open_bundles):
        close(subject)
    return messages


def _bundle(members: list[EncodedEvent]) -> EncodedEvent:
    if len(members) == 1:
        return members[0]
    first = members[0]
    digest = hashlib.blake2b(digest_size=16)
    for member in members:
        digest.update(member.event_id.encode())
        digest.update(b"\n")
    bundle_id = f"bundle-{digest.hexdigest()}"
    headers = {
        "content-type": "application/x-ndjson",
        "tuneloop-event": first.headers["tuneloop-event"],
        "tuneloop-schema": first.headers["tuneloop-schema"],
        BUNDLE_HEADER: str(len(members)),
        "Nats-Msg-Id": bundle_id,
    }
    payload = b"\n".join(member.payload for member in members)
    return EncodedEvent(first.subject, first.stream, bundle_id, headers, payload, bundled=True)


async def publish_many(
    broker: NatsBroker, events: Sequence[Event | EncodedEvent], *, timeout_s: float = 5.0
) -> list[BaseException | None]:
    """Publish JetStream events together: all go out at once and their acks are awaited as a
    group (up to `timeout_s`). Returns each event's outcome in order: None when the stream
    stored it, else the error, so the caller can keep exactly the ones that failed elsewhere.
    Events of a bundled class go out in bundles (`bundles`); each shares its bundle's outcome.

    Sent with nats-py's `publish_async` rather than FastStream's publish, which spends a request
    inbox and a codec pass per message: ~90 us of CPU per captured sample against ~60.
    """
    try:
        connection = broker.connection
    except IncorrectState:  # FastStream's word for "never connected, or stopped"
        connection = None
    if connection is None:
        return [BusUnavailable("not connected to NATS") for _ in events]
    js = _publish_contexts.get(connection)
    if js is None:
        js = _publish_contexts[connection] = connection.jetstream()
    outcomes: list[BaseException | None] = [None] * len(events)
    encoded: list[EncodedEvent] = []
    positions: list[int] = []  # of each encoded event in `events`
    for i, event in enumerate(events):
        try:
            encoded.append(event if isinstance(event, EncodedEvent) else encode(event))
            positions.append(i)
        except Exception as exc:  # an event of no stream: this one failed
            outcomes[i] = exc
    pending: list[tuple[asyncio.Future[Any] | BaseException, list[int]]] = []
    for message, members in bundles(encoded):
        try:
            sent: asyncio.Future[Any] | BaseException = await js.publish_async(
                message.subject, message.payload, stream=message.stream, headers=message.headers
            )
        except Exception as exc:  # not connected, too many in flight: this message failed
            sent = exc
        pending.append((sent, members))
    futures = [sent for sent, _ in pending if isinstance(sent, asyncio.Future)]
    if futures:
        await asyncio.wait(futures, timeout=timeout_s)
    for sent, members in pending:
        outcome = _outcome(sent)
        for member in members:
            outcomes[positions[member]] = outcome
    return outcomes


def _outcome(item: asyncio.Future[Any] | BaseException) -> BaseException | None:
    if isinstance(item, BaseException):
        return item
    if not item.done():
        item.cancel()
        return TimeoutError("no ack from the stream in time")
    return item.exception()


def durable_name(service: str, event_cls: type[Event]) -> str:
    """One durable consumer per (service, event): every instance of the service shares it."""
    return f"{service}__{event_cls.event_name}_v{event_cls.event_version}".replace(".", "_")


def subscribe(
    router: NatsRouter | NatsBroker,
    event_cls: type[E],
    *,
    service: str,
    max_deliver: int = redelivery.UNLIMITED,
    ack_wait_s: float = 60.0,
    batch_size: int = 32,
    retry: RetryPolicy | None = None,
) -> Callable[[Handler], Any]:
    """Decorator: consume `event_cls` from every tenant.

    JetStream events use a durable pull consumer named for the service, so more instances of a
    service share the work and a restarted one carries on where the last left off. The message
    is acked after the handler returns. When it raises, the policy of shared.redelivery applies:
    a recoverable fault is nacked with `retry`'s backoff and delivered again (without limit
    unless `max_deliver` says otherwise); a message that does not decode or validate, or whose
    handler raised `PermanentError` (or FastStream's RejectMessage), is dead-lettered and
    terminated. A handler may also ack or nack the message itself. Core-NATS events (presence)
    are a plain subscription. A bundled event class is refused: its messages may hold several
    events, which only `consume_batches` reads.
    """
    if event_cls.bundled:
        raise ValueError(f"{event_cls.__name__} may arrive in bundles; use consume_batches")
    description = inspect.cleandoc(event_cls.__doc__ or "")  # the AsyncAPI document's words
    if event_cls.stream is None:
        return router.subscriber(
            event_cls.subject_pattern(), title=event_cls.__name__, description=description
        )
    durable = durable_name(service, event_cls)
    config = ConsumerConfig(
        durable_name=durable,
        max_deliver=max_deliver,
        ack_wait=ack_wait_s,
        filter_subject=event_cls.subject_pattern(),
    )
    # FastStream binds to an existing durable as it is; declare_streams updates it first.
    redelivery.declare_consumer(event_cls.stream.name, config)
    subscriber = router.subscriber(
        event_cls.subject_pattern(),
        stream=JStream(event_cls.stream.name, declare=False),
        durable=durable,
        pull_sub=PullSub(batch_size=batch_size, timeout=5.0),
        config=config,
        ack_policy=AckPolicy.MANUAL,  # every ack, nak and term is DeliveryMiddleware's
        title=f"{service}:{event_cls.__name__}",
        description=description,
    )
    _delivery_middleware(router).add(subscriber, consumer=durable, retry=retry or RetryPolicy())
    return subscriber


# One delivery middleware per router or broker that `subscribe` put a JetStream subscriber on.
_delivery: weakref.WeakKeyDictionary[NatsRouter | NatsBroker, redelivery.DeliveryMiddleware] = (
    weakref.WeakKeyDictionary()
)


def _delivery_middleware(router: NatsRouter | NatsBroker) -> redelivery.DeliveryMiddleware:
    middleware = _delivery.get(router)
    if middleware is None:
        middleware = _delivery[router] = redelivery.DeliveryMiddleware()
        router.add_middleware(middleware)
    return middleware


def watch(router: NatsRouter | NatsBroker, event_cls: type[E]) -> Callable[[Handler], Any]:
    """Decorator: every instance sees every `event_cls` event, from the start of the stream.

    For state each instance keeps in memory (the gateway's routing table): an ephemeral ordered
    consumer replays the history at start-up and then follows new events. Nothing is left
    behind on the server when the instance goes away.
    """
    if event_cls.stream is None:
        raise ValueError(f"{event_cls.__name__} is not stored in a stream; subscribe to it instead")
    return router.subscriber(
        event_cls.subject_pattern(),
        stream=JStream(event_cls.stream.name, declare=False),
        ordered_consumer=True,
        deliver_policy=DeliverPolicy.ALL,
        title=f"watch:{event_cls.__name__}",
        description=inspect.cleandoc(event_cls.__doc__ or ""),
    )


# --- batched pull consumption -------------------------------------------------------------------


class PoisonMessage(PermanentError, ValueError):
    """Raised by a batch consumer's `decode` for an event no retry can fix (malformed, another
    schema version): it is dead-lettered, never redelivered, and the reason is logged."""


T = TypeVar("T")
# One event's JSON and the subject it came on -> what the handler takes.
Decode = Callable[[bytes, str], T]
HandleBatch = Callable[[list[T]], Awaitable[None]]
# Told of each event stored in the dead-letter stream: (subject, event JSON, reason). For a
# message that could not even be split into events, the JSON is the whole payload.
OnDeadLetter = Callable[[str, bytes, str], None]
# Failures in a row, none succeeding, after which the rest of a batch waits: its dependency is away.
_FAILURES_BEFORE_PAUSE = 3


@dataclass(frozen=True)
class BatchOptions:
    """How a `BatchConsumer` pulls. `max_deliver` and `ack_wait_s` configure the durable
    consumer; an existing one is brought to them at start. A failed message comes back after
    `retry_delay_s` doubling per delivery, at most `max_retry_delay_s`; the consumer pauses as
    long while nothing in a batch succeeds."""

    batch_size: int = 256
    fetch_timeout_s: float = 1.0
    max_deliver: int = redelivery.UNLIMITED
    ack_wait_s: float = 60.0
    retry_delay_s: float = 1.0  # the first backoff, and between attempts to subscribe
    max_retry_delay_s: float = 30.0

    @property
    def retry(self) -> RetryPolicy:
        return RetryPolicy(self.retry_delay_s, self.max_retry_delay_s)


def consume_batches(
    broker: NatsBroker,
    event_cls: type[Event],
    *,
    service: str,
    decode: Decode[T],
    handle: HandleBatch[T],
    options: BatchOptions | None = None,
    on_dead_letter: OnDeadLetter | None = None,
) -> BatchConsumer[T]:
    """A `BatchConsumer` of `event_cls` on the broker's connection, for `service`; `start()` it
    once the broker is connected and `stop()` it before the broker stops (a service's
    `ServiceRuntime.on_lifecycle` hooks do both)."""

    def connection() -> NatsClient | None:
        return broker.connection if broker.connection is not None else None

    return BatchConsumer(
        connection,
        event_cls,
        service=service,
        decode=decode,
        handle=handle,
        options=options,
        on_dead_letter=on_dead_letter,
    )


class BatchConsumer(Generic[T]):
    """A durable pull consumer of `event_cls` that hands messages to `handle` in batches.

    FastStream 0.7.8's batch pull loop stalls (it catches nats.errors.TimeoutError, but nats-py
    raises a plain asyncio.TimeoutError when a pull ends early), so this loop uses nats-py
    directly, with the durable name and config `subscribe` gives the same (service, event): the
    two are interchangeable on a running stream. Delivery stays at-least-once: every message of
    a batch is acked after `handle` returns, so `handle` must be idempotent. When `handle`
    raises, each message is retried alone, so one bad message cannot hold back the others; one
    that still fails is nacked with a capped exponential backoff and comes back for as long as
    the fault lasts, and while nothing succeeds the consumer pauses. `decode` runs per event (a
    bundle holds several, see `bundles`); an event it refuses with `PoisonMessage` (or a
    message whose `handle` raises `PermanentError`) is copied to the dead-letter stream and
    `on_dead_letter` is told; a message left with no event to handle is then terminated.
    """

    def __init__(
        self,
        connection: Callable[[], NatsClient | None],
        event_cls: type[Event],
        *,
        service: str,
        decode: Decode[T],
        handle: HandleBatch[T],
        options: BatchOptions | None = None,
        on_dead_letter: OnDeadLetter | None = None,
    ) -> None:
        if event_cls.stream is None:
            raise ValueError(f"{event_cls.__name__} is not stored in a stream")
        self._connection = connection
        self._event_cls = event_cls
        self._stream = event_cls.stream.name
        self._durable = durable_name(service, event_cls)
        self._decode = decode
        self._handle = handle
        self._on_dead_letter = on_dead_letter
        self.options = options or BatchOptions()
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._busy = False  # a batch is in hand: stop() lets it finish

    async def start(self) -> None:
        self._stopping.clear()
        self._task = asyncio.create_task(self._run(), name=f"batches-{self._durable}")

    async def stop(self, timeout_s: float = 10.0) -> None:
        """Finish the batch in hand (bounded), then stop. A batch cut off is redelivered."""
        task, self._task = self._task, None
        if task is None:
            return
        self._stopping.set()
        if self._busy:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(task), timeout_s)
        # Idle in a fetch (or past the deadline): cancel. Messages a cut-off fetch had already
        # received are not acked, so the server delivers them again after the ack wait.
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                subscription = await self._subscribe()
                await self._consume(subscription)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning(
                    "%s: pull consumer failed (%s: %s); retrying in %.0fs",
                    self._durable,
                    type(exc).__name__,
                    exc,
                    self.options.retry_delay_s,
                )
                await self._pause(self.options.retry_delay_s)

    async def _subscribe(self) -> JetStreamContext.PullSubscription:
        connection = self._connection()
        if connection is None or not connection.is_connected:
            raise ConnectionError("NATS is not connected")
        subject = self._event_cls.subject_pattern()
        config = ConsumerConfig(
            durable_name=self._durable,
            max_deliver=self.options.max_deliver,
            ack_wait=self.options.ack_wait_s,
            filter_subject=subject,
        )
        js = connection.jetstream()
        await redelivery.ensure_consumer(js, self._stream, config)
        return await js.pull_subscribe(
            subject, durable=self._durable, stream=self._stream, config=config
        )

    async def _consume(self, subscription: JetStreamContext.PullSubscription) -> None:
        try:
            while not self._stopping.is_set():
                try:
                    messages = await subscription.fetch(
                        self.options.batch_size, timeout=self.options.fetch_timeout_s
                    )
                except (TimeoutError, nats.errors.TimeoutError):
                    continue  # nothing to do; both types, see the class docstring
                self._busy = True
                try:
                    await self._process(messages)
                finally:
                    self._busy = False
        finally:
            with contextlib.suppress(Exception):
                await subscription.unsubscribe()

    async def _process(self, messages: list[Msg]) -> None:
        decoded: list[tuple[Msg, list[T]]] = []
        for message in messages:
            items = await self._decode_message(message)
            if items:
                decoded.append((message, items))
        if not decoded:
            return
        try:
            await self._handle([item for _, items in decoded for item in items])
        except Exception as exc:
            if len(decoded) > 1:
                log.warning(
                    "%s: a batch of %d messages failed (%s: %s); handling them one by one",
                    self._durable,
                    len(decoded),
                    type(exc).__name__,
                    exc,
                )
                await self._one_by_one(decoded)
            elif not await self._failed(decoded[0][0], exc):
                await self._pause(self.options.retry.delay_s(redelivery.delivered(decoded[0][0])))
            return
        for message, _ in decoded:
            await message.ack()

    async def _decode_message(self, message: Msg) -> list[T]:
        """The message's events decoded. Those that can never be handled are dead-lettered (a
        message left with none is then terminated); if that copy fails, the whole message is
        nacked and [] returned, to be tried again."""
        try:
            events = _events_of(message)
        except PoisonMessage as exc:
            await self._give_up(message, [(message.data, str(exc))], whole=True)
            return []
        items: list[T] = []
        refused: list[tuple[bytes, str]] = []
        for n, data in enumerate(events):
            try:
                items.append(self._decode(data, message.subject))
            except PoisonMessage as exc:
                refused.append((data, f"event {n + 1}: {exc}" if len(events) > 1 else str(exc)))
        if not refused:
            return items
        if not await self._give_up(message, refused, whole=not items):
            return []
        if items:
            log.warning(
                "%s: %d of the %d events in message %s dropped, they can never be handled: %s",
                self._durable,
                len(refused),
                len(events),
                redelivery.sequence(message),
                "; ".join(reason for _, reason in refused),
            )
        return items

    async def _give_up(
        self, message: Msg, refused: list[tuple[bytes, str]], *, whole: bool
    ) -> bool:
        """Dead-letter the refused events (the whole message when `whole`, and terminate it)."""
        reason = "; ".join(reason for _, reason in refused)
        if whole:
            stored = await redelivery.give_up(
                message, consumer=self._durable, reason=reason, retry=self.options.retry
            )
        else:
            payload, headers = _part_of(message, [data for data, _ in refused])
            stored = await redelivery.give_up(
                message,
                consumer=self._durable,
                reason=reason,
                retry=self.options.retry,
                payload=payload,
                headers=headers,
            )
        if stored and self._on_dead_letter is not None:
            for data, why in refused:
                self._on_dead_letter(message.subject, data, why)
        return stored

    async def _failed(self, message: Msg, exc: Exception) -> bool:
        """A message `handle` failed on, alone: dead-lettered when it can never be handled
        (True), else nacked with backoff (False)."""
        if not redelivery.is_permanent(exc):
            await redelivery.retry_later(
                message, exc, consumer=self._durable, retry=self.options.retry
            )
            return False
        try:
            events = _events_of(message)
        except PoisonMessage:
            events = [message.data]
        reason = redelivery.reason_of(exc)
        await self._give_up(message, [(data, reason) for data in events], whole=True)
        return True

    async def _one_by_one(self, decoded: list[tuple[Msg, list[T]]]) -> None:
        succeeded, failed_in_a_row, first_failed = False, 0, 0
        for position, (message, items) in enumerate(decoded):
            if not succeeded and failed_in_a_row >= _FAILURES_BEFORE_PAUSE:
                # Nothing works: the database or a dependency is away. The rest wait with the
                # same backoff rather than each costing a failed attempt (and maybe a timeout).
                for rest, _ in decoded[position:]:
                    await rest.nak(delay=self.options.retry.delay_s(redelivery.delivered(rest)))
                break
            try:
                await self._handle(items)
            except Exception as exc:
                if not await self._failed(message, exc):
                    failed_in_a_row += 1
                    first_failed = first_failed or redelivery.delivered(message)
            else:
                await message.ack()
                succeeded, failed_in_a_row = True, 0
        if first_failed and not succeeded:
            await self._pause(self.options.retry.delay_s(first_failed))  # do not spin

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)


def _events_of(message: Msg) -> list[bytes]:
    """The JSON of each event a message carries: one, or a bundle's lines."""
    declared = (message.headers or {}).get(BUNDLE_HEADER)
    if declared is None:
        return [message.data]
    lines = message.data.split(b"\n")
    if str(len(lines)) != declared:
        raise PoisonMessage(
            f"{BUNDLE_HEADER}: says {declared} events, the payload has {len(lines)}"
        )
    return lines


def _part_of(message: Msg, events: list[bytes]) -> tuple[bytes, dict[str, str]]:
    """The payload and headers of a message carrying only `events` of `message`'s bundle."""
    headers = {k: v for k, v in (message.headers or {}).items() if k != BUNDLE_HEADER}
    if len(events) > 1:
        headers[BUNDLE_HEADER] = str(len(events))
    else:
        headers["content-type"] = "application/json"
    return b"\n".join(events), headers

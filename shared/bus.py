"""The NATS bus through FastStream: broker factory, start-up readiness, streams, typed publish/subscribe.

Publishers and subscribers take an event *class* from shared.events, never a subject string, so
producer and consumer cannot drift apart. JetStream events are published with the event id as
`Nats-Msg-Id`, so a retried publish inside the stream's duplicate window is stored once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

import nats.js.errors
from faststream.middlewares import AckPolicy
from faststream.nats import ConsumerConfig, DeliverPolicy, JStream, NatsBroker, NatsRouter, PullSub
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig
from tenacity import AsyncRetrying, RetryError, stop_after_delay, wait_exponential

from shared.events import STREAMS, Event, Stream
from shared.settings import NatsSettings

log = logging.getLogger("tuneloop.bus")

E = TypeVar("E", bound=Event)
Handler = Callable[..., Any]

# JetStream's error code for "a stream with this name exists with a different configuration".
_STREAM_NAME_IN_USE = 10058
_SECONDS_PER_DAY = 86_400


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


async def declare_streams(js: JetStreamContext, settings: NatsSettings) -> None:
    """Create every stream, or bring an existing one to the declared limits. Safe to run concurrently."""
    for stream in STREAMS:
        config = stream_config(stream, settings)
        try:
            await js.add_stream(config)
        except nats.js.errors.BadRequestError as exc:
            if exc.err_code != _STREAM_NAME_IN_USE:
                raise
            await js.update_stream(config)


async def publish(broker: NatsBroker, event: Event, *, timeout_s: float = 5.0) -> None:
    """Publish an event on its own subject; JetStream events wait (up to `timeout_s`) for the
    stream's ack and raise when it does not come, so the caller can keep the event elsewhere."""
    headers = {"tuneloop-event": type(event).__name__, "tuneloop-schema": str(event.schema_version)}
    if event.stream is None:
        await broker.publish(event, subject=event.subject, headers=headers)
        return
    headers["Nats-Msg-Id"] = event.event_id
    await broker.publish(
        event, subject=event.subject, headers=headers, stream=event.stream.name, timeout=timeout_s
    )


def durable_name(service: str, event_cls: type[Event]) -> str:
    """One durable consumer per (service, event): every instance of the service shares it."""
    return f"{service}__{event_cls.event_name}_v{event_cls.event_version}".replace(".", "_")


def subscribe(
    router: NatsRouter | NatsBroker,
    event_cls: type[E],
    *,
    service: str,
    max_deliver: int = 10,
    ack_wait_s: float = 60.0,
    batch_size: int = 32,
) -> Callable[[Handler], Any]:
    """Decorator: consume `event_cls` from every tenant.

    JetStream events use a durable pull consumer named for the service, so more instances of a
    service share the work and a restarted one carries on where the last left off. The message
    is acked after the handler returns and nacked (redelivered, up to `max_deliver`) if it
    raises. Core-NATS events (presence) are a plain subscription.
    """
    description = (event_cls.__doc__ or "").strip()
    if event_cls.stream is None:
        return router.subscriber(
            event_cls.subject_pattern(), title=event_cls.__name__, description=description
        )
    durable = durable_name(service, event_cls)
    return router.subscriber(
        event_cls.subject_pattern(),
        stream=JStream(event_cls.stream.name, declare=False),
        durable=durable,
        pull_sub=PullSub(batch_size=batch_size, timeout=5.0),
        config=ConsumerConfig(
            durable_name=durable,
            max_deliver=max_deliver,
            ack_wait=ack_wait_s,
            filter_subject=event_cls.subject_pattern(),
        ),
        ack_policy=AckPolicy.NACK_ON_ERROR,
        title=f"{service}:{event_cls.__name__}",
        description=description,
    )


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
        description=(event_cls.__doc__ or "").strip(),
    )

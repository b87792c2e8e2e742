"""What a consumer does with a message it could not handle, on both of the bus's consumption paths.

A recoverable fault (the database refused or timed out, a lock, a dependency away) is retried for
as long as it lasts: durable consumers have unlimited deliveries and the message is nacked with a
capped exponential backoff from its delivery count. A message that can never be handled (it does
not decode or validate, or its handler raised `PermanentError`) is copied to the dead-letter
stream (shared.deadletters) and only then terminated. `subscribe` (FastStream) gets this policy
from `DeliveryMiddleware`; `BatchConsumer` (nats-py) applies it itself.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import nats.js.errors
import pydantic
from faststream import BaseMiddleware
from faststream.exceptions import AckMessage, HandlerException, NackMessage, RejectMessage
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig

from shared import deadletters
from shared.events import DEADLETTERS

log = logging.getLogger("tuneloop.bus")

# Unlimited deliveries: a fault that lasts is retried as long as it lasts.
UNLIMITED = -1


class PermanentError(Exception):
    """Raised by a handler for a message no retry can fix (invalid, another schema version):
    the message is dead-lettered and terminated, never redelivered."""


@dataclass(frozen=True)
class RetryPolicy:
    """Delay before a failed message comes back: `first_delay_s` doubling per delivery, at most
    `max_delay_s`."""

    first_delay_s: float = 1.0
    max_delay_s: float = 30.0

    def delay_s(self, delivered: int) -> float:
        doublings = min(max(delivered - 1, 0), 32)  # 2**32 s is past any cap
        return min(self.max_delay_s, self.first_delay_s * float(2**doublings))


def is_permanent(exc: BaseException) -> bool:
    """Whether no retry can help: the message is invalid, not the moment."""
    return isinstance(
        exc, PermanentError | pydantic.ValidationError | json.JSONDecodeError | UnicodeDecodeError
    )


def reason_of(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def delivered(message: Msg) -> int:
    try:
        return int(message.metadata.num_delivered)
    except Exception:  # not a JetStream message (a test double)
        return 1


def sequence(message: Msg) -> str:
    try:
        return f"#{message.metadata.sequence.stream}"
    except Exception:  # not a JetStream message (a test double); the subject still helps
        return message.subject


# --- the durable consumer's configuration ------------------------------------------------------

# Consumers `subscribe` declared in this process, brought to their config at start-up.
_declared: dict[tuple[str, str], ConsumerConfig] = {}
# What start-up changes on an existing durable; the server edits these in place.
_EDITABLE = ("max_deliver", "ack_wait", "backoff", "description")


def declare_consumer(stream: str, config: ConsumerConfig) -> None:
    """Remember a durable for `update_declared_consumers` (bus.declare_streams calls it)."""
    assert config.durable_name
    _declared[(stream, config.durable_name)] = config


async def update_declared_consumers(js: JetStreamContext) -> None:
    for (stream, _), config in list(_declared.items()):
        await ensure_consumer(js, stream, config, create=False)


async def ensure_consumer(
    js: JetStreamContext, stream: str, config: ConsumerConfig, *, create: bool = True
) -> None:
    """Create the durable, or bring an existing one to `config`: a durable keeps the config it
    was created with (an older release's max_deliver of 10 would drop messages in an outage)."""
    durable = config.durable_name
    assert durable
    try:
        current = (await js.consumer_info(stream, durable)).config
    except nats.js.errors.NotFoundError:
        if create:
            await js.add_consumer(stream, config)
        return
    changed = {
        field: getattr(config, field)
        for field in _EDITABLE
        if getattr(config, field) is not None and getattr(current, field) != getattr(config, field)
    }
    if not changed:
        return
    try:
        await js.add_consumer(stream, current.evolve(**changed))  # create-or-update by name
    except nats.js.errors.BadRequestError as exc:
        log.error(
            "%s: consumer kept its old config, the server refused %s: %s", durable, changed, exc
        )
        return
    log.info("%s: consumer config brought up to date: %s", durable, changed)


# --- giving up on a message ---------------------------------------------------------------------


async def give_up(
    message: Msg,
    *,
    consumer: str,
    reason: str,
    retry: RetryPolicy,
    payload: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> bool:
    """Dead-letter `message` (or part of it: `payload`, `headers`), then terminate it. True when
    both happened; when the copy could not be stored the message is nacked (not lost) instead."""
    try:
        js = message._client.jetstream()  # nats-py keeps the connection a message came on here
        seq = await deadletters.dead_letter(
            js, message, consumer=consumer, reason=reason, payload=payload, headers=headers
        )
    except Exception as exc:
        delay = retry.delay_s(delivered(message))
        log.warning(
            "%s: message %s can never be handled (%s) but its dead-letter copy failed (%s); "
            "retrying in %.0fs",
            consumer, sequence(message), reason, reason_of(exc), delay,
        )  # fmt: skip
        await message.nak(delay=delay)
        return False
    if payload is None:
        await message.term()
    log.warning(
        "%s: %s %s dead-lettered as %s #%d%s, it can never be handled: %s",
        consumer, "message" if payload is None else "part of message", sequence(message),
        DEADLETTERS.name, seq, " and terminated" if payload is None else "", reason,
    )  # fmt: skip
    return True


async def retry_later(
    message: Msg, exc: BaseException, *, consumer: str, retry: RetryPolicy
) -> float:
    """Nack a message whose handling failed for now; returns the delay asked for."""
    count = delivered(message)
    delay = retry.delay_s(count)
    log.warning(
        "%s: message %s failed on delivery %d (%s); nacked for redelivery in %.0fs",
        consumer, sequence(message), count, reason_of(exc), delay,
        exc_info=exc if count == 1 else None,  # the traceback once, not at every retry
    )  # fmt: skip
    await message.nak(delay=delay)
    return delay


# --- FastStream's subscribers -------------------------------------------------------------------


@dataclass(frozen=True)
class _Subscription:
    consumer: str
    retry: RetryPolicy


class DeliveryMiddleware:
    """The policy for the JetStream subscribers `bus.subscribe` put on one router or broker
    (subscribed with AckPolicy.MANUAL, so FastStream leaves every ack to this). Other
    subscribers of that router pass through untouched."""

    def __init__(self) -> None:
        # id(subscriber) -> (subscriber, policy); the subscriber is held so its id stays its own.
        self._subscriptions: dict[int, tuple[Any, _Subscription]] = {}

    def add(self, subscriber: Any, *, consumer: str, retry: RetryPolicy) -> None:
        self._subscriptions[id(subscriber)] = (subscriber, _Subscription(consumer, retry))

    def subscription(self, subscriber: Any) -> _Subscription | None:
        held = self._subscriptions.get(id(subscriber))
        return held[1] if held is not None and held[0] is subscriber else None

    def __call__(self, msg: Any, /, *, context: Any) -> _DeliveryScope:
        return _DeliveryScope(msg, context=context, owner=self)


class _DeliveryScope(BaseMiddleware):
    def __init__(self, msg: Any, /, *, context: Any, owner: DeliveryMiddleware) -> None:
        super().__init__(msg, context=context)
        self._owner = owner

    async def after_processed(
        self,
        exc_type: type[BaseException] | None = None,
        exc_val: BaseException | None = None,
        exc_tb: TracebackType | None = None,
    ) -> bool | None:
        subscription = self._owner.subscription(self.context.get_local("handler_"))
        message = self.msg
        if subscription is None or not isinstance(message, Msg):
            return False
        if isinstance(exc_val, asyncio.CancelledError):
            return False  # a stop: unacked, the server delivers it again after the ack wait
        if getattr(message, "_ackd", False):  # the handler acked or nacked it itself
            return exc_val is None or isinstance(exc_val, HandlerException)
        await _settle(message, exc_val, subscription)
        return True  # handled and logged here


async def _settle(message: Msg, exc: BaseException | None, subscription: _Subscription) -> None:
    consumer, retry = subscription.consumer, subscription.retry
    if exc is None or isinstance(exc, AckMessage):
        await message.ack()
    elif isinstance(exc, NackMessage):
        delay = exc.extra_options.get("delay")
        await message.nak(delay=retry.delay_s(delivered(message)) if delay is None else delay)
    elif isinstance(exc, RejectMessage) or is_permanent(exc):
        reason = "rejected by its handler" if isinstance(exc, RejectMessage) else reason_of(exc)
        await give_up(message, consumer=consumer, reason=reason, retry=retry)
    elif isinstance(exc, HandlerException):  # SkipMessage: done with it
        await message.ack()
    else:
        await retry_later(message, exc, consumer=consumer, retry=retry)

"""docs/reference/asyncapi.json: FastStream's own AsyncAPI 3.0 document of every service's broker.

The subscribers are the services' own, as their app factories wire them. The services publish
through `shared.bus.publish` (one function for every event, no publisher objects), so the
publishers are declared here on each broker, with the event class as `schema` and its
docstring as `description`, from who builds which event (wiring.producers). The batch consumers
(`bus.consume_batches`, nats-py underneath) are declared as the pull subscribers they are.
"""

from __future__ import annotations

import inspect
import json
from importlib.metadata import version
from typing import Any

from faststream.nats import JStream, NatsBroker, PullSub
from faststream.specification import AsyncAPI

from shared import bus
from shared.dev.docs_gen import wiring
from shared.events import CATALOGUE, Event

DESCRIPTION = """\
The tuneloop bus: NATS with JetStream. Every event is a pydantic model in shared/events.py; its \
subject carries the tenant and the schema version (`tuneloop.<tenant>.<domain>.<fact>.v<n>`), \
so NATS permissions can scope an integrator to its own events. Channels are named \
`<service>:<Event>` for a durable consumer (every instance of the service shares it), \
`watch:<Event>` for an ordered consumer each instance runs, and `<service>:publish:<Event>` for \
what a service publishes. Delivery is at-least-once: handle an event idempotently, by its \
`event_id`. The catalogue in words: events.md."""


def document(brokers: dict[str, NatsBroker]) -> dict[str, Any]:
    produced = wiring.producers()
    for service, broker in brokers.items():
        for cls in CATALOGUE.values():
            makers = {producer.service for producer in produced.get(wiring.key(cls), [])}
            if service in makers or wiring.EVERY_SERVICE in makers:
                _publisher(broker, service, cls)
    for service, cls in wiring.batch_consumers():
        _batch_subscriber(brokers[service], service, cls)
    spec = AsyncAPI(
        *brokers.values(),
        title="tuneloop events",
        version=version("tuneloop"),
        description=DESCRIPTION,
        schema_version="3.0.0",
    ).to_specification()
    jsonable: dict[str, Any] = spec.to_jsonable()
    return jsonable


def render(brokers: dict[str, NatsBroker]) -> str:
    return json.dumps(document(brokers), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def _description(cls: type[Event]) -> str:
    return inspect.cleandoc(cls.__doc__) if cls.__doc__ else ""


def _publisher(broker: NatsBroker, service: str, cls: type[Event]) -> None:
    broker.publisher(
        cls.subject_pattern(),
        stream=JStream(cls.stream.name, declare=False) if cls.stream else None,
        title=f"{service}:publish:{cls.__name__}",
        description=_description(cls),
        schema=cls,
    )


def _batch_subscriber(broker: NatsBroker, service: str, cls: type[Event]) -> None:
    assert cls.stream is not None, f"{cls.__name__}: batch consumers read streams"
    durable = bus.durable_name(service, cls)
    subscriber = broker.subscriber(
        cls.subject_pattern(),
        stream=JStream(cls.stream.name, declare=False),
        durable=durable,
        pull_sub=PullSub(),
        title=f"{service}:{cls.__name__}",
        description=_description(cls),
    )

    async def handle(event: Event) -> None:
        """Never called: declares the message type this consumer reads."""

    handle.__annotations__["event"] = cls
    handle.__name__ = f"batches_{cls.event_name.replace('.', '_')}"
    subscriber(handle)

"""Who publishes and who consumes each event, read from the code rather than declared.

Producers: the modules that construct an event class (`JobFailed(...)`), found by parsing the
source of services/ and shared/; a service publishes only events it builds. Consumers: the
subscribers on each service's own FastStream broker, as its app factory wires them, plus the
batch consumers (`bus.consume_batches`), which run on nats-py and so are found in the source.
"""

from __future__ import annotations

import ast
import functools
import re
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from faststream.nats import NatsBroker

from shared import bus
from shared.events import CATALOGUE, Event

ROOT = Path(__file__).resolve().parents[3]
# Where events are built: every service and the shared kernel, less the definitions themselves.
SOURCES = ("services", "shared")
DEFINITIONS = Path("shared/events.py")
EVERY_SERVICE = "every service"

ConsumerKind = Literal["durable", "watch", "core"]


@dataclass(frozen=True, order=True)
class Producer:
    service: str
    path: str  # relative to the repository root


@dataclass(frozen=True, order=True)
class Consumer:
    service: str
    kind: ConsumerKind
    # The durable consumer's name (shared.bus.durable_name): instances of the service share it.
    durable: str | None = None


def key(cls: type[Event]) -> str:
    return f"{cls.event_name}.v{cls.event_version}"


def _classes() -> dict[str, type[Event]]:
    return {cls.__name__: cls for cls in CATALOGUE.values()}


def _python_files() -> Iterator[Path]:
    for top in SOURCES:
        for path in sorted((ROOT / top).rglob("*.py")):
            relative = path.relative_to(ROOT)
            if relative != DEFINITIONS and ".venv" not in relative.parts:
                yield relative


def _service_of(path: Path) -> str:
    """The process a module runs in: its service, or every service for the shared kernel."""
    return path.parts[1] if path.parts[0] == "services" else EVERY_SERVICE


def _called_name(node: ast.Call) -> str | None:
    if isinstance(node.func, ast.Name):
        return node.func.id
    if isinstance(node.func, ast.Attribute):
        return node.func.attr
    return None


@functools.cache
def _calls() -> tuple[tuple[Path, ast.Call], ...]:
    """Every call of an event class or of `consume_batches`, with its module. A module whose
    text names none of them is not parsed (most are not)."""
    names = sorted({*_classes(), "consume_batches"})
    wanted = re.compile(r"\b(?:" + "|".join(names) + r")\(")
    found = []
    for path in _python_files():
        text = (ROOT / path).read_text(encoding="utf-8")
        if not wanted.search(text):
            continue
        for node in ast.walk(ast.parse(text, filename=str(path))):
            if isinstance(node, ast.Call) and _called_name(node) in names:
                found.append((path, node))
    return tuple(found)


def producers() -> dict[str, list[Producer]]:
    """Event key -> the modules that build it."""
    classes = _classes()
    found: dict[str, set[Producer]] = defaultdict(set)
    for path, call in _calls():
        name = _called_name(call)
        if name in classes:
            found[key(classes[name])].add(Producer(_service_of(path), path.as_posix()))
    return {event: sorted(items) for event, items in found.items()}


def batch_consumers() -> list[tuple[str, type[Event]]]:
    """(service, event class) of every `consume_batches(broker, EventClass, ...)` call."""
    classes = _classes()
    found = set()
    for path, call in _calls():
        if _called_name(call) != "consume_batches" or len(call.args) < 2:
            continue
        event = call.args[1]
        if isinstance(event, ast.Name) and event.id in classes:
            found.add((_service_of(path), event.id))
    return [(service, classes[name]) for service, name in sorted(found)]


def consumers(brokers: dict[str, NatsBroker]) -> dict[str, list[Consumer]]:
    """Event key -> its consumers: each service broker's subscribers and the batch consumers."""
    by_subject = {cls.subject_pattern(): cls for cls in CATALOGUE.values()}
    found: dict[str, set[Consumer]] = defaultdict(set)
    for service, broker in brokers.items():
        for title, subject in subscriptions(broker):
            cls = by_subject[subject]
            found[key(cls)].add(_consumer(service, title, cls))
    for service, cls in batch_consumers():
        found[key(cls)].add(Consumer(service, "durable", bus.durable_name(service, cls)))
    return {event: sorted(items) for event, items in found.items()}


def subscriptions(broker: NatsBroker) -> Iterable[tuple[str, str]]:
    """(AsyncAPI channel title, subject) of every FastStream subscriber of the broker."""
    for subscriber in broker.subscribers:
        for title, channel in subscriber.schema().items():
            binding = channel.bindings.nats if channel.bindings else None
            if binding is not None:
                yield title, binding.subject


def _consumer(service: str, title: str, cls: type[Event]) -> Consumer:
    # shared.bus names its subscribers: "<durable's service>:<Class>", "watch:<Class>", or the
    # class alone for a core-NATS subscription.
    if title.startswith("watch:"):
        return Consumer(service, "watch")
    if ":" in title:
        return Consumer(service, "durable", bus.durable_name(title.split(":")[0], cls))
    return Consumer(service, "core")

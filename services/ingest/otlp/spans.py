"""The neutral span model OTLP export requests decode to, the decode errors, and the limits
that bound a hostile request. Shared by the JSON and protobuf readers (`otlp_json`,
`otlp_proto`); callers import it all from `otlp`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

STATUS_UNSET, STATUS_OK, STATUS_ERROR = 0, 1, 2
_KIND_NAMES = ("UNSPECIFIED", "INTERNAL", "SERVER", "CLIENT", "PRODUCER", "CONSUMER")
_STATUS_NAMES = ("UNSET", "OK", "ERROR")
# Generic protobuf JSON writers emit enum names ("SPAN_KIND_CLIENT"); OTLP/JSON emits ints.
SPAN_KINDS = {n: i for i, n in enumerate(_KIND_NAMES)} | {
    f"SPAN_KIND_{n}": i for i, n in enumerate(_KIND_NAMES)
}
STATUS_CODES = {n: i for i, n in enumerate(_STATUS_NAMES)} | {
    f"STATUS_CODE_{n}": i for i, n in enumerate(_STATUS_NAMES)
}


class OtlpDecodeError(ValueError):
    """The body is not a usable export request; `path` names where, e.g.
    `resourceSpans[0].scopeSpans[1].spans[3].traceId`."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason

    def __reduce__(self) -> tuple[type[OtlpDecodeError], tuple[str, str]]:
        # Raised in an OTLP mapping process and pickled back: rebuilt from its two parts.
        return type(self), (self.path, self.reason)


class OtlpTooLargeError(OtlpDecodeError):
    """A hard limit was exceeded (the HTTP layer answers 413)."""


class OtlpUnsupportedError(OtlpDecodeError):
    """Content-Type or Content-Encoding this receiver does not speak (HTTP 415)."""


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds that keep a hostile request's cost proportional to a sane one."""

    max_body_bytes: int = 32 << 20  # after decompression: a gzip bomb stops here
    max_spans: int = 20_000
    # A longer string/bytes value is left out of the span (listed in `Span.oversized`).
    max_value_bytes: int = 4 << 20
    max_attributes: int = 10_000  # per span, event or resource
    max_events: int = 10_000  # per span
    max_depth: int = 16  # nesting of arrayValue / kvlistValue


DEFAULT_LIMITS = Limits()


@dataclass(slots=True)
class SpanEvent:
    name: str
    time_ns: int
    attributes: dict[str, Any]


@dataclass(slots=True)
class SpanStatus:
    code: int = STATUS_UNSET
    message: str = ""


@dataclass(slots=True)
class Span:
    """One span with plain Python values: ids lowercase hex, attributes as str / bool / int /
    float / bytes / list / dict / None."""

    trace_id: str
    span_id: str
    parent_span_id: str | None  # None: a root span
    name: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    events: list[SpanEvent] = field(default_factory=list)
    status: SpanStatus = field(default_factory=SpanStatus)
    resource: dict[str, Any] = field(default_factory=dict)
    scope_name: str | None = None
    scope_version: str | None = None
    # Attributes left out for exceeding Limits.max_value_bytes: key -> size. Event attributes
    # appear as "<event name>/<key>".
    oversized: dict[str, int] = field(default_factory=dict)


class ValueTooLarge(Exception):
    """Raised by a decoder's value reader, caught by its attribute loop: the attribute is left
    out and listed in `Span.oversized` instead of failing the whole request."""

    def __init__(self, size: int) -> None:
        self.size = size


class BadValue(Exception):
    """A decode error on its way up. Each level it passes adds its own path segment, so paths
    are only formatted for the one value that failed, never in the hot loop."""

    def __init__(self, where: str, reason: str, *, too_large: bool = False) -> None:
        self.segments = [where] if where else []
        self.reason = reason
        self.too_large = too_large

    def under(self, segment: str) -> BadValue:
        self.segments.append(segment)
        return self

    def error(self) -> OtlpDecodeError:
        path = "".join(reversed(self.segments)).lstrip(".") or "body"
        kind = OtlpTooLargeError if self.too_large else OtlpDecodeError
        return kind(path, self.reason)

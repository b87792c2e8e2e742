"""Structured logging for every tuneloop process: one JSON object per line, secrets redacted.

`configure_logging` installs one handler on the root logger. Its filter formats each message
with its arguments and runs the result, every `extra=` value and the exception text through
`shared.redact`, so a secret never reaches a log line even when someone logs a header dict or a
URL with `?key=`. uvicorn and FastStream loggers are routed through the same handler:

- run uvicorn with `log_config=None`, or it replaces these settings with its own;
- give the broker our logger, `NatsBroker(..., logger=logging.getLogger("faststream.access.nats"))`,
  because FastStream otherwise builds its own stdout handler when the broker starts.
"""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

import orjson
from opentelemetry import trace

from shared.redact import redact_mapping, redact_text

# Loggers that libraries give their own handlers (and propagate=False); we take them back.
ROUTED_LOGGERS = (
    "uvicorn",
    "uvicorn.error",
    "uvicorn.access",
    "faststream",
    "faststream.access",
)

# Attributes every LogRecord has; anything else on a record came from `extra=`.
_RECORD_FIELDS = frozenset(
    {
        *vars(logging.LogRecord("", 0, "", 0, "", None, None)),
        "message",
        "asctime",
        "taskName",
    }
)
_REDACTED_MARK = "_tuneloop_redacted"
# uvicorn attaches an ANSI-coloured copy of every message; it is noise in a JSON line.
_DROPPED_EXTRAS = frozenset({_REDACTED_MARK, "color_message"})


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {
        k: v
        for k, v in vars(record).items()
        if k not in _RECORD_FIELDS and k not in _DROPPED_EXTRAS
    }


def _json_safe(value: Any) -> Any:
    """Plain JSON values only, so an object's str() cannot carry a secret past redaction."""
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    try:
        return orjson.loads(orjson.dumps(value, default=str, option=orjson.OPT_NON_STR_KEYS))
    except (TypeError, orjson.JSONEncodeError):
        return repr(value)


class RedactingFilter(logging.Filter):
    """Redacts message, arguments, extras and exception text, once per record."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, _REDACTED_MARK, False):
            return True  # a record passes every handler; redacting once is enough
        # Format first: a secret can hide in any argument's str(), not just in strings.
        record.msg = redact_text(_message(record))
        record.args = None
        for key, value in _extras(record).items():
            setattr(record, key, redact_mapping({key: _json_safe(value)})[key])
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact_text(record.exc_text)
        if record.stack_info:
            record.stack_info = redact_text(record.stack_info)
        setattr(record, _REDACTED_MARK, True)
        return True


def _message(record: logging.LogRecord) -> str:
    try:
        return record.getMessage()
    except Exception:  # a bad format string must not turn a log call into a crash
        return f"{record.msg!s} (unformattable log arguments: {record.args!r})"


def _timestamp(record: logging.LogRecord) -> str:
    return (
        datetime.fromtimestamp(record.created, tz=UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


def _trace_ids() -> dict[str, str]:
    """The current span's ids, so a log line can be found from its trace and back."""
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return {}
    return {"trace_id": f"{context.trace_id:032x}", "span_id": f"{context.span_id:016x}"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, service, logger, msg, extras, exc."""

    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname,
            "service": self.service,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update(_trace_ids())
        for key, value in _extras(record).items():
            entry.setdefault(key, value)  # an extra named `service` must not hide the real one
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            entry["exc"] = record.exc_text
        if record.stack_info:
            entry["stack"] = record.stack_info
        return orjson.dumps(entry, default=str, option=orjson.OPT_NON_STR_KEYS).decode()


class HumanFormatter(logging.Formatter):
    """`ts LEVEL service logger: msg key=value ...`, for a developer's terminal."""

    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        extras = " ".join(f"{k}={v!r}" for k, v in _extras(record).items())
        line = (
            f"{_timestamp(record)} {record.levelname:<7} {self.service} {record.name}: "
            f"{record.getMessage()}{' ' + extras if extras else ''}"
        )
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line = f"{line}\n{record.exc_text}"
        if record.stack_info:
            line = f"{line}\n{record.stack_info}"
        return line


class _ServiceHandler(logging.StreamHandler[TextIO]):
    """The handler configure_logging installs; its type lets a second call find and replace it."""


def configure_logging(
    service: str,
    *,
    level: str | int = "INFO",
    json: bool = True,
    stream: TextIO | None = None,
) -> logging.Handler:
    """Send every log record of this process, redacted, to `stream` (stderr by default).

    Idempotent: a second call replaces the handler the first one installed, so tests and
    reloads never print a line twice. Returns the installed handler.
    """
    handler = _ServiceHandler(stream if stream is not None else sys.stderr)
    handler.addFilter(RedactingFilter())
    handler.setFormatter(JsonFormatter(service) if json else HumanFormatter(service))

    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _ServiceHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
    _route_library_loggers()
    return handler


def _route_library_loggers() -> None:
    """Strip the handlers uvicorn and FastStream install, and let their records reach root."""
    names = set(ROUTED_LOGGERS)
    names.update(n for n in logging.root.manager.loggerDict if n.startswith("faststream."))
    for name in names:
        lib_logger = logging.getLogger(name)
        for old in list(lib_logger.handlers):
            lib_logger.removeHandler(old)
        lib_logger.propagate = True
        lib_logger.setLevel(logging.NOTSET)  # the root level decides, in one place

"""shared.logs: JSON lines with the agreed fields, and no secret in any part of a record."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import orjson
import pytest

from shared.logs import configure_logging
from shared.redact import REDACTED, register_secret

OPENAI_KEY = "sk-abcdefghijklmnopqrstuvwxyz0123456789ABCD"
REGISTERED = "registered-admin-token-7Yq2"


@pytest.fixture
def stream() -> Iterator[io.StringIO]:
    """A stream the service handler writes to; the root logger is restored afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    buffer = io.StringIO()
    configure_logging("ingest", level="DEBUG", stream=buffer)
    yield buffer
    root.handlers[:] = handlers
    root.setLevel(level)


def lines(buffer: io.StringIO) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in buffer.getvalue().splitlines()]


def test_json_line_has_agreed_fields(stream: io.StringIO) -> None:
    logging.getLogger("tuneloop.ingest.api").warning(
        "stored %d samples", 3, extra={"tenant": "acme", "batch": [1, 2]}
    )
    [entry] = lines(stream)
    assert entry["level"] == "WARNING"
    assert entry["service"] == "ingest"
    assert entry["logger"] == "tuneloop.ingest.api"
    assert entry["msg"] == "stored 3 samples"
    assert entry["tenant"] == "acme"
    assert entry["batch"] == [1, 2]
    assert entry["ts"].endswith("Z")
    assert datetime.fromisoformat(entry["ts"]).utcoffset().total_seconds() == 0  # type: ignore[union-attr]


def test_secrets_in_message_args_and_extras_never_reach_the_line(stream: io.StringIO) -> None:
    register_secret(REGISTERED)
    log = logging.getLogger("tuneloop.test")
    log.info("upstream said Authorization: Bearer %s", OPENAI_KEY)
    log.info("headers %s", {"Authorization": f"Bearer {OPENAI_KEY}", "accept": "*/*"})
    log.info("fetching %s", "https://gen.test/v1/models?key=AIza-secret-value&alt=json")
    log.info("admin token is %s", REGISTERED)
    log.info(
        "request",
        extra={
            "headers": {"x-api-key": "plain-key-value", "accept": "*/*"},
            "admin": REGISTERED,
            "password": "hunter2",
        },
    )
    output = stream.getvalue()
    for secret in (OPENAI_KEY, REGISTERED, "AIza-secret-value", "plain-key-value", "hunter2"):
        assert secret not in output
    entries = lines(stream)
    assert entries[0]["msg"] == f"upstream said Authorization: Bearer {REDACTED}"
    assert entries[2]["msg"] == f"fetching https://gen.test/v1/models?key={REDACTED}&alt=json"
    assert entries[4]["headers"] == {"x-api-key": REDACTED, "accept": "*/*"}
    assert entries[4]["password"] == REDACTED


def test_exception_text_is_included_and_redacted(stream: io.StringIO) -> None:
    try:
        raise RuntimeError(f"upstream refused key {OPENAI_KEY}")
    except RuntimeError:
        logging.getLogger("tuneloop.test").exception("call failed")
    [entry] = lines(stream)
    assert entry["level"] == "ERROR"
    assert "RuntimeError: upstream refused key" in entry["exc"]
    assert "Traceback" in entry["exc"]
    assert OPENAI_KEY not in stream.getvalue()


def test_objects_with_secret_str_are_redacted(stream: io.StringIO) -> None:
    class Client:
        def __str__(self) -> str:
            return f"Client(api_key={OPENAI_KEY})"

    logging.getLogger("tuneloop.test").info("built", extra={"client": Client()})
    [entry] = lines(stream)
    assert entry["client"] == f"Client(api_key={REDACTED})"


def test_bad_format_arguments_do_not_raise(stream: io.StringIO) -> None:
    logging.getLogger("tuneloop.test").info("two %s %s", "one")
    [entry] = lines(stream)
    assert entry["msg"].startswith("two %s %s (unformattable")


def test_configure_twice_writes_each_line_once(stream: io.StringIO) -> None:
    configure_logging("ingest", level="DEBUG", stream=stream)
    logging.getLogger("tuneloop.test").info("once")
    assert [e["msg"] for e in lines(stream)] == ["once"]
    ours = [h for h in logging.getLogger().handlers if type(h).__name__ == "_ServiceHandler"]
    assert len(ours) == 1


def test_level_filters_records(stream: io.StringIO) -> None:
    configure_logging("ingest", level="WARNING", stream=stream)
    log = logging.getLogger("tuneloop.test")
    log.info("hidden")
    log.warning("shown")
    assert [e["msg"] for e in lines(stream)] == ["shown"]


def test_library_loggers_are_routed_through_the_handler(stream: io.StringIO) -> None:
    uvicorn_access = logging.getLogger("uvicorn.access")
    uvicorn_access.addHandler(logging.StreamHandler(io.StringIO()))  # as uvicorn's config does
    uvicorn_access.propagate = False
    configure_logging("ingest", level="DEBUG", stream=stream)
    uvicorn_access.info('%s - "%s %s HTTP/1.1" %d', "10.0.0.1", "GET", "/v1?token=abc", 200)
    [entry] = lines(stream)
    assert entry["logger"] == "uvicorn.access"
    assert entry["msg"] == f'10.0.0.1 - "GET /v1?token={REDACTED} HTTP/1.1" 200'
    assert uvicorn_access.handlers == []


def test_human_format(stream: io.StringIO) -> None:
    configure_logging("trainer", level="INFO", json=False, stream=stream)
    logging.getLogger("tuneloop.trainer").info(
        "step %d", 7, extra={"loss": 0.5, "token": OPENAI_KEY}
    )
    line = stream.getvalue().strip()
    assert " INFO    trainer tuneloop.trainer: step 7 " in line
    assert "loss=0.5" in line
    assert OPENAI_KEY not in line

"""Which format a line is in, from the keys it has; see the package docstring for the table."""

from __future__ import annotations

from typing import Literal, NamedTuple, get_args

from services.ingest.http.errors import BadRequest
from services.ingest.normalize import NormalizeError
from services.ingest.uploads.formats import logs
from services.ingest.uploads.formats._common import JsonObject

Format = Literal[
    "openai_finetune", "openai_log", "anthropic_log", "gemini_log", "sharegpt", "alpaca"
]
FORMATS: tuple[Format, ...] = get_args(Format)
LOG_FORMATS: dict[Format, logs.LogProvider] = {
    "openai_log": "openai",
    "anthropic_log": "anthropic",
    "gemini_log": "gemini",
}
_FORMAT_OF: dict[logs.LogProvider, Format] = {p: f for f, p in LOG_FORMATS.items()}
_Family = Format | Literal["log"]
_EXPECTED = "expected one of messages / conversations / instruction / request+response"


class UnknownFormat(BadRequest, ValueError):
    """The `format` asked for is not one this module reads (a bad request, not a bad line)."""


def check_format(name: str) -> Format | Literal["auto"]:
    """`name` as a format, or UnknownFormat listing the ones there are."""
    if name == "auto":
        return "auto"
    for known in FORMATS:
        if name == known:
            return known
    raise UnknownFormat(f"format: unknown format {name!r}: expected auto, {', '.join(FORMATS)}")


class Detected(NamedTuple):
    format: Format
    # What gave it away, for messages ("it has conversations", "the response has choices").
    evidence: str


def detect_format(line: JsonObject) -> Detected:
    """The format of a line; NormalizeError when no family's keys, or more than one's, are there."""
    families = _families(line)
    if not families:
        keys = ", ".join(sorted(line)[:8]) or "none"
        raise NormalizeError("", f"cannot tell the format: {_EXPECTED} (the line has {keys})")
    if len(families) > 1:
        said = " and ".join(evidence for _, evidence in families)
        raise NormalizeError(
            "", f"cannot tell the format: the line has {said}; pass a format to choose one"
        )
    ((family, evidence),) = families
    if family == "log":
        provider, evidence = logs.detect_provider(logs.read_record(line))
        return Detected(_FORMAT_OF[provider], evidence)
    return Detected(family, f"it has {evidence}")


def _families(line: JsonObject) -> list[tuple[_Family, str]]:
    """Each format family whose deciding keys the line has, with those keys."""
    found: list[tuple[_Family, str]] = []
    if logs.is_log(line):
        keys = "request+response" if "request" in line else "req+resp"
        found.append(("log", keys if "request" in line or "req" in line else "messages+response"))
    elif "messages" in line:
        found.append((_messages_family(line), "messages"))
    if "conversations" in line:
        found.append(("sharegpt", "conversations"))
    if "instruction" in line:
        found.append(("alpaca", "instruction"))
    return found


def _messages_family(line: JsonObject) -> Format:
    """`messages` of `from`/`value` turns are ShareGPT; of `role`/`content` ones, OpenAI's."""
    messages = line["messages"]
    first = messages[0] if isinstance(messages, list) and messages else None
    if isinstance(first, dict) and "from" in first and "role" not in first:
        return "sharegpt"
    return "openai_finetune"

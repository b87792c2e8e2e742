"""Typed reads of untrusted JSON: each helper returns the value in the expected shape or raises
NormalizeError naming the path, so the normalisers never meet a KeyError or TypeError."""

from __future__ import annotations

import re
from typing import Any

import orjson

from services.ingest.normalize import NormalizeError

JsonObject = dict[str, Any]

_CAMEL_HUMP = re.compile(r"([A-Z])")


def at(path: str, key: str | int) -> str:
    """`path` extended by a key (`messages.role`) or an index (`messages[2]`)."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def _kind(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}
    if value is None:
        return "null"
    return names.get(type(value), "a number" if isinstance(value, int | float) else "?")


def obj(value: Any, path: str) -> JsonObject:
    if not isinstance(value, dict):
        raise NormalizeError(path, f"must be an object, not {_kind(value)}")
    return value


def opt_obj(value: Any, path: str) -> JsonObject | None:
    return None if value is None else obj(value, path)


def arr(value: Any, path: str) -> list[Any]:
    if not isinstance(value, list):
        raise NormalizeError(path, f"must be an array, not {_kind(value)}")
    return value


def opt_arr(value: Any, path: str) -> list[Any]:
    """An array, with null/absent read as empty."""
    return [] if value is None else arr(value, path)


def one_or_many(value: Any, path: str) -> list[tuple[str, Any]]:
    """(path, item) for each item of an array, or for a single object given in its place (the
    Gemini REST API accepts both)."""
    if isinstance(value, dict):
        return [(path, value)]
    return [(at(path, i), item) for i, item in enumerate(arr(value, path))]


def text(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise NormalizeError(path, f"must be a string, not {_kind(value)}")
    return value


def opt_text(value: Any, path: str) -> str | None:
    return None if value is None else text(value, path)


def name(value: Any, path: str) -> str:
    """A required non-empty string (a function or tool name)."""
    if not text(value, path):
        raise NormalizeError(path, "must not be empty")
    return str(value)


def opt_bool(value: Any, path: str) -> bool | None:
    if value is not None and not isinstance(value, bool):
        raise NormalizeError(path, f"must be a boolean, not {_kind(value)}")
    return value


def count(value: Any) -> int | None:
    """A token count, or None when absent or not a non-negative integer."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def loads(data: str, path: str) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise NormalizeError(path, f"is not valid JSON ({exc})") from None


def snake_case(camel: str) -> str:
    return _CAMEL_HUMP.sub(r"_\1", camel).lower()


def pick(body: JsonObject, path: str, camel: str) -> tuple[str, Any]:
    """The value of a field the Gemini REST API accepts in camelCase or snake_case
    (`inlineData` / `inline_data`), with the path of the spelling used (camelCase if neither)."""
    if camel not in body:
        snake = snake_case(camel)
        if snake in body:
            return at(path, snake), body[snake]
    return at(path, camel), body.get(camel)

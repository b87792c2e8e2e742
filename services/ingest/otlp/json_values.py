"""OTLP/JSON's scalar values as real producers write them: either field-name spelling,
int64s as strings or JS numbers, ids in hex or base64, protobufjs Buffers and Longs, enum names.
Each raises `BadValue` naming what it got; decode_json.py adds the path."""

from __future__ import annotations

import base64
import binascii
from typing import Any

from services.ingest.otlp.spans import BadValue

_UINT64_MAX = (1 << 64) - 1
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def get_field(obj: dict[str, Any], camel: str, snake: str) -> Any:
    """OTLP/JSON uses lowerCamelCase; protobuf JSON parsers also accept the proto field name."""
    value = obj.get(camel)
    return obj.get(snake) if value is None else value


def kind_of(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}.get(
        type(value), "null" if value is None else "a number"
    )


def as_object(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadValue(where, f"must be an object, not {kind_of(value)}")
    return value


def as_array(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise BadValue(where, f"must be an array, not {kind_of(value)}")
    return value


def as_string(value: Any, where: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise BadValue(where, f"must be a string, not {kind_of(value)}")
    return value


def as_int64(value: Any, where: str, *, unsigned: bool) -> int:
    """Decimal string, JSON number or protobufjs Long `{low, high, unsigned}`."""
    if value is None:
        return 0
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str):
        try:
            number = int(value)
        except ValueError:
            raise BadValue(where, f"not an integer: {value[:40]!r}") from None
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    elif isinstance(value, dict) and "low" in value and "high" in value:
        number = as_long(value, where)
    else:
        raise BadValue(where, f"must be an integer, not {kind_of(value)}")
    low, high = (0, _UINT64_MAX) if unsigned else (_INT64_MIN, _INT64_MAX)
    if not low <= number <= high:
        raise BadValue(where, f"{number} is out of range for a 64-bit integer")
    return number


def as_long(value: dict[str, Any], where: str) -> int:
    low, high = value.get("low"), value.get("high")
    if not isinstance(low, int) or not isinstance(high, int):
        raise BadValue(where, "a Long needs integer low and high words")
    number = (low & 0xFFFFFFFF) | ((high & 0xFFFFFFFF) << 32)
    if not value.get("unsigned") and number >> 63:
        number -= 1 << 64  # two's complement, as protobufjs stores signed Longs
    return number


def as_enum(value: Any, names: dict[str, int], where: str) -> int:
    if value is None:
        return 0
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        if value in names:
            return names[value]
        if value.isdigit():
            return int(value)
    raise BadValue(where, f"unknown enum value {str(value)[:40]!r}")


def text_id(text: str, size: int, where: str) -> str:
    if len(text) == 2 * size:
        try:
            if len(bytes.fromhex(text)) == size:
                return text.lower()
        except ValueError:
            pass
    try:
        padded = text.replace("-", "+").replace("_", "/") + "=" * (-len(text) % 4)
        raw = base64.b64decode(padded, validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != size:
        raise BadValue(where, f"not {size} bytes (expected hex or base64)")
    return raw.hex()


def as_buffer(value: Any, where: str) -> bytes:
    """A protobufjs Buffer `{"type": "Buffer", "data": [..]}` or a bare byte array."""
    data = value.get("data") if isinstance(value, dict) else value
    if not isinstance(data, list):
        raise BadValue(where, f"must be a hex string or byte buffer, not {kind_of(value)}")
    try:
        return bytes(data)
    except (TypeError, ValueError):
        raise BadValue(where, "a byte buffer holds integers 0-255 only") from None


def json_id(value: Any, size: int, where: str, *, optional: bool = False) -> str | None:
    if value is None or value == "":
        if optional:
            return None
        raise BadValue(where, f"not {size} bytes (missing)")
    if isinstance(value, str):
        hex_id = text_id(value, size, where)
    else:
        raw = as_buffer(value, where)
        if len(raw) != size:
            raise BadValue(where, f"not {size} bytes")
        hex_id = raw.hex()
    # Some exporters write an all-zero parent id for a root span.
    if optional and not hex_id.strip("0"):
        return None
    return hex_id


def as_double(value: Any) -> float:
    if isinstance(value, bool):
        raise BadValue("", "must be a number, not a boolean")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):  # proto3 JSON writes "NaN", "Infinity" and may quote numbers
        try:
            return float(value)
        except ValueError:
            pass
    raise BadValue("", f"must be a number, not {kind_of(value)}")

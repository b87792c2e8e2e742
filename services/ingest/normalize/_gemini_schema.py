"""Gemini function schemas (an OpenAPI 3.0 subset) as JSON Schema, which ToolDef.parameters
holds: types become lowercase JSON Schema names (Vertex sends integer enums, `"type": 6`, and
the SDKs send "STRING"/"OBJECT"), `nullable` becomes a `"null"` type, snake_case keywords
become camelCase, and `propertyOrdering` goes (JSON Schema keeps order in `properties` itself;
a different order is noted)."""

from __future__ import annotations

from typing import Any

from services.ingest.normalize import NormalizeError
from services.ingest.normalize._json import JsonObject, arr, at, obj
from services.ingest.normalize._sample import Notes

# google.cloud.aiplatform.v1.Type / google.ai.generativelanguage Type.
_INT_TYPES = {
    1: "string",
    2: "number",
    3: "integer",
    4: "boolean",
    5: "array",
    6: "object",
    7: "null",
}
_TYPES = frozenset(_INT_TYPES.values())
_KEYWORDS = {
    "any_of": "anyOf",
    "property_ordering": "propertyOrdering",
    "max_items": "maxItems",
    "min_items": "minItems",
    "max_length": "maxLength",
    "min_length": "minLength",
    "max_properties": "maxProperties",
    "min_properties": "minProperties",
}
# Deeper than any real tool schema; a bound so hostile input cannot exhaust the stack.
_MAX_DEPTH = 64


def json_schema(schema: Any, path: str, notes: Notes, depth: int = 0) -> JsonObject:
    if depth > _MAX_DEPTH:
        raise NormalizeError(path, f"nests deeper than {_MAX_DEPTH} levels")
    out: JsonObject = {}
    nullable = False
    ordering: Any = None
    for key, value in obj(schema, path).items():
        keyword, where = _KEYWORDS.get(key, key), at(path, key)
        if keyword == "type":
            if (kind := _type(value, where)) is not None:
                out["type"] = kind
        elif keyword == "properties":
            props = obj(value, where)
            out["properties"] = {
                k: json_schema(v, at(where, k), notes, depth + 1) for k, v in props.items()
            }
        elif keyword == "items":
            out["items"] = json_schema(value, where, notes, depth + 1)
        elif keyword == "anyOf":
            out["anyOf"] = [
                json_schema(v, at(where, i), notes, depth + 1)
                for i, v in enumerate(arr(value, where))
            ]
        elif keyword == "nullable":
            nullable = value is True
        elif keyword == "propertyOrdering":
            ordering = value
        else:
            out[keyword] = value
    if nullable and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    if ordering is not None and ordering != list(out.get("properties", {})):
        notes.drop(
            at(path, "propertyOrdering"), "an order other than that of `properties` is not carried"
        )
    return out


def _type(value: Any, path: str) -> str | list[str] | None:
    """The JSON Schema type name; None for TYPE_UNSPECIFIED (no constraint)."""
    if isinstance(value, list):
        kinds = [_type(item, at(path, i)) for i, item in enumerate(value)]
        return [k for k in kinds if isinstance(k, str)]
    if isinstance(value, int) and not isinstance(value, bool):
        if value == 0:
            return None
        if value in _INT_TYPES:
            return _INT_TYPES[value]
    elif isinstance(value, str):
        kind = value.strip().lower()
        if kind == "type_unspecified":
            return None
        if kind in _TYPES:
            return kind
    raise NormalizeError(path, f"unknown schema type {value!r}")

"""What the upload formats share: typed reads of untrusted JSON that fail naming the field, safe
construction of canonical models, the fidelity notes, and tool definitions in the two shapes
datasets write them (OpenAI's `{type, function}` wrapper, or the bare function)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError

from services.ingest.normalize import Dropped, NormalizeError
from shared.chat import Message, RequestParams, ToolDef, error_path

JsonObject = dict[str, Any]
Model = TypeVar("Model", bound=BaseModel)

_KINDS = {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}


def at(path: str, key: str | int) -> str:
    """`path` extended by a key (`messages.role`) or an index (`messages[2]`)."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def join(path: str, rest: str) -> str:
    """`path` followed by a relative path (`name`, `[0].name`, `.name` or ` line 3`)."""
    if not path or not rest:
        return path or rest.lstrip(".")
    return path + rest if rest[0] in ".[ " else f"{path}.{rest}"


def kind(value: Any) -> str:
    """What a JSON value is, in words, for an error message."""
    if value is None:
        return "null"
    return _KINDS.get(type(value), "a number" if isinstance(value, int | float) else "?")


def required(record: Mapping[str, Any], key: str, path: str) -> Any:
    if key not in record:
        raise NormalizeError(path, "is required")
    return record[key]


def obj(value: Any, path: str) -> JsonObject:
    if not isinstance(value, dict):
        raise NormalizeError(path, f"must be an object, not {kind(value)}")
    return value


def arr(value: Any, path: str) -> list[Any]:
    if not isinstance(value, list):
        raise NormalizeError(path, f"must be an array, not {kind(value)}")
    return value


def opt_arr(value: Any, path: str) -> list[Any]:
    """An array, with null/absent read as empty."""
    return [] if value is None else arr(value, path)


def text(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise NormalizeError(path, f"must be a string, not {kind(value)}")
    return value


def opt_text(value: Any, path: str) -> str | None:
    return None if value is None else text(value, path)


def opt_bool(value: Any, path: str) -> bool | None:
    if value is not None and not isinstance(value, bool):
        raise NormalizeError(path, f"must be a boolean, not {kind(value)}")
    return value


def json_text(value: str, path: str) -> Any:
    """A JSON document held in a string field (ShareGPT keeps calls and tools that way)."""
    try:
        return orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise NormalizeError(path, f"is not valid JSON ({exc.msg})") from None


def build(cls: type[Model], path: str, /, **fields: Any) -> Model:
    """`cls(**fields)`, with a validation failure reported as a NormalizeError under `path`."""
    try:
        return cls(**fields)
    except ValidationError as exc:
        error = exc.errors()[0]
        raise NormalizeError(join(path, error_path(tuple(error["loc"]))), error["msg"]) from None


class Notes:
    """The fidelity report of one line: what its samples do not carry, and why."""

    def __init__(self) -> None:
        self.dropped: list[Dropped] = []

    def drop(self, path: str, reason: str) -> None:
        self.dropped.append(Dropped(path, reason))

    def unknown_keys(self, record: Mapping[str, Any], known: Iterable[str], path: str) -> None:
        """Note every field outside `known` that holds something (null, [], {} and "" say
        nothing), so nothing is dropped silently."""
        known = set(known)
        for key, value in record.items():
            if key not in known and value not in (None, [], {}, ""):
                self.drop(at(path, key), f"{key!r} is not carried")


@dataclass
class Chat:
    """A conversation read from a dataset line, before it becomes a sample."""

    messages: list[Message]
    tools: list[ToolDef] = field(default_factory=list)
    params: RequestParams = field(default_factory=RequestParams)


def require_assistant(messages: list[Message], path: str) -> None:
    """A training line without an assistant turn has nothing to learn from (OpenAI's validator
    rejects it too)."""
    if not any(message.role == "assistant" for message in messages):
        raise NormalizeError(path, "needs at least one assistant message to train on")


def tool_defs(value: Any, path: str) -> list[ToolDef]:
    """Function tools given as OpenAI's `{"type": "function", "function": {...}}` or as the bare
    `{"name", "description"?, "parameters"?}` (ShareGPT/LLaMA-Factory, the legacy `functions`)."""
    tools = []
    for i, item in enumerate(opt_arr(value, path)):
        where = at(path, i)
        item = obj(item, where)
        tool_type = item.get("type", "function")
        if tool_type != "function":
            raise NormalizeError(
                at(where, "type"), f"{tool_type!r} tools are not supported (only function)"
            )
        if "function" in item:
            where = at(where, "function")
            item = obj(item["function"], where)
        tools.append(
            build(
                ToolDef,
                where,
                name=text(required(item, "name", at(where, "name")), at(where, "name")),
                description=opt_text(item.get("description"), at(where, "description")),
                parameters=item.get("parameters"),
                strict=item.get("strict"),
            )
        )
    return tools

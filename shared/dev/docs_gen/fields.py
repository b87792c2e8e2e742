"""Reading the settings classes: their fields' variables, types, defaults and descriptions.

A field's description is its `Field(description=...)`, else the comment block right above it.
A field with neither, written right below a described one (no blank line, no comment between),
shares that description and says "as above": the settings modules group related fields under
one comment. A field with none of these is a defect the tests name. Secrets never show a value.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types
from pydantic import AliasChoices, BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from pydantic_settings import BaseSettings

from shared import settings as shared_settings
from shared.dev.localstack import SERVICES

ROOT = Path(__file__).resolve().parents[3]
# Where settings classes live: the shared concerns, then each service's own.
MODULES = ("shared.settings", *(f"services.{name}.config" for name in SERVICES))
AS_ABOVE = "as above"


@dataclass(frozen=True)
class Variable:
    names: tuple[str, ...]  # the environment variable, and any alias it also answers to
    type: str
    default: str
    description: str


@dataclass(frozen=True)
class Concern:
    cls: type[BaseSettings]
    module: str
    prefix: str
    doc: str
    variables: tuple[Variable, ...]

    @property
    def path(self) -> str:
        return self.module.replace(".", "/") + ".py"


def settings_classes() -> list[tuple[str, type[BaseSettings]]]:
    """(module, class) for every settings class of MODULES, in source order."""
    found: list[tuple[str, type[BaseSettings]]] = []
    for name in MODULES:
        module = importlib.import_module(name)
        classes = [
            cls
            for cls in vars(module).values()
            if inspect.isclass(cls)
            and issubclass(cls, BaseSettings)
            and cls.__module__ == module.__name__
        ]
        classes.sort(key=lambda cls: inspect.getsourcelines(cls)[1])
        found.extend((name, cls) for cls in classes)
    return found


def concerns() -> list[Concern]:
    return [_concern(module, cls) for module, cls in settings_classes()]


def _concern(module: str, cls: type[BaseSettings]) -> Concern:
    prefix = str(cls.model_config.get("env_prefix", ""))
    comments = field_comments(cls)
    variables = tuple(
        Variable(
            names=_env_names(prefix, name, field),
            type=type_of(field, sizes=name.endswith("_bytes")),
            default=default_of(field, sizes=name.endswith("_bytes")),
            description=field.description or comments.get(name, ""),
        )
        for name, field in cls.model_fields.items()
    )
    doc = inspect.cleandoc(cls.__doc__) if cls.__doc__ else ""
    return Concern(cls, module, prefix, doc, variables)


def field_comments(cls: type[BaseModel], *, groups: bool = True) -> dict[str, str]:
    """Field name -> the comment describing it, by the rule in this module's docstring;
    `groups` False: a field's own comment only."""
    fields = cls.model_fields
    lines, _ = inspect.getsourcelines(cls)
    source = inspect.cleandoc("".join(lines)) if lines[0].startswith(" ") else "".join(lines)
    text = source.splitlines()
    tree = ast.parse(source).body[0]
    assert isinstance(tree, ast.ClassDef)
    described = {name for name, field in fields.items() if field.description}
    found: dict[str, str] = {}
    in_group = False  # the field on the line before has a comment (its own or its group's)
    previous_end = -1
    for node in tree.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            in_group = False
            continue
        name = node.target.id
        comment = _comment_above(text, node.lineno - 1)
        if comment:
            found[name] = comment
        elif groups and in_group and node.lineno - 1 == previous_end + 1:
            found[name] = AS_ABOVE
        # A field with a description of its own heads no group.
        in_group = name in found and name not in described
        previous_end = (node.end_lineno or node.lineno) - 1
    return found


def _comment_above(text: list[str], index: int) -> str:
    block: list[str] = []
    while index > 0 and text[index - 1].strip().startswith("#"):
        index -= 1
        block.insert(0, text[index].strip().lstrip("#").strip())
    return " ".join(block)


def _env_names(prefix: str, name: str, field: FieldInfo) -> tuple[str, ...]:
    alias = field.validation_alias
    if isinstance(alias, AliasChoices):
        return tuple(str(choice) for choice in alias.choices)
    return (f"{prefix}{name}".upper(),)


# --- types ------------------------------------------------------------------------------------

_NAMES = {str: "string", int: "integer", float: "number", bool: "boolean", Path: "path"}


def type_of(field: FieldInfo, *, sizes: bool = False) -> str:
    """The field's type in words, with its bounds (`sizes`: numbers are bytes, say them in KiB...)."""
    described = _describe(field.annotation)
    bounds = _bounds(field.metadata, sizes)
    return f"{described}, {bounds}" if bounds else described


def _describe(annotation: Any) -> str:
    if annotation is shared_settings.ServiceUrl:
        return "URL"
    origin = get_origin(annotation)
    args = get_args(annotation)
    if origin in (Union, types.UnionType):
        present = [arg for arg in args if arg is not type(None)]
        inner = " or ".join(_describe(arg) for arg in present)
        return f"{inner} (optional)" if len(present) < len(args) else inner
    if origin is Literal:
        return "one of " + ", ".join(f"`{arg}`" for arg in args)
    if origin is Annotated:
        pattern = _pattern(args[1:])
        if pattern and "https?://" in pattern:
            return "URL"
        return _describe(args[0]) + (f" matching `{pattern}`" if pattern else "")
    if origin is list:
        item = _describe(args[0]) if args else "anything"
        return f"JSON list, each {item}" if item.startswith("one of") else f"JSON list of {item}"
    if annotation is SecretStr:
        return "secret string"
    return _NAMES.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _pattern(metadata: Any) -> str | None:
    for item in metadata:
        pattern = getattr(item, "pattern", None)
        if isinstance(pattern, str):
            return pattern
    return None


_LIMITS: tuple[tuple[type[annotated_types.BaseMetadata], str], ...] = (
    (annotated_types.Ge, "≥"),
    (annotated_types.Gt, ">"),
    (annotated_types.Le, "≤"),
    (annotated_types.Lt, "<"),
)


def _bounds(metadata: list[Any], sizes: bool) -> str:
    parts = []
    for item in metadata:
        for kind, symbol in _LIMITS:
            if isinstance(item, kind):
                parts.append(f"{symbol} {number(getattr(item, kind.__name__.lower()), sizes)}")
        if isinstance(item, annotated_types.MinLen):
            parts.append(f"length ≥ {item.min_length}")
        if isinstance(item, annotated_types.MaxLen):
            parts.append(f"length ≤ {item.max_length}")
        pattern = getattr(item, "pattern", None)
        if isinstance(pattern, str) and "https?://" in pattern:
            continue  # said by the type: URL
        if isinstance(pattern, str):
            parts.append(f"matching `{pattern}`")
    return ", ".join(parts)


# --- defaults ---------------------------------------------------------------------------------


def default_of(field: FieldInfo, *, sizes: bool = False) -> str:
    if field.default_factory is not None:
        return "computed at start-up"
    value = field.default
    if value is PydanticUndefined:
        return "required"
    if isinstance(value, SecretStr):
        return _secret_default(value)
    if value is None:
        return "unset"
    if value == shared_settings.DEV_S3_ACCESS_KEY:
        return f"`{value}` (the local stack's; refused in production)"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, int | float):
        return number(value, sizes)
    if isinstance(value, Path):
        return f"`{_relative(value)}`"
    if isinstance(value, list):
        return f"`{json.dumps(value)}`"
    return f"`{value}`" if value != "" else "empty"


def _secret_default(value: SecretStr) -> str:
    plain = value.get_secret_value()
    if not plain:
        return "empty"
    if plain.strip().lower() in shared_settings._PLACEHOLDER_SECRETS:
        return "a development placeholder: **set it in production** (refused there)"
    return "set (not shown)"


def number(value: float, sizes: bool = False) -> str:
    """A number as the page writes it; `sizes`: bytes, with KiB, MiB or GiB beside."""
    if isinstance(value, float) and not value.is_integer():
        return f"`{value:g}`"
    whole = int(value)
    if not sizes:
        return f"`{whole}`"
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if whole >= size and whole % size == 0:
            return f"`{whole}` ({whole // size} {unit})"
    return f"`{whole}`"


def _relative(path: Path) -> str:
    """A default inside the source tree as its path there (where the checkout is, differs)."""
    if path.is_absolute() and path.is_relative_to(ROOT):
        return f"<source tree>/{path.relative_to(ROOT).as_posix()}"
    return path.as_posix()

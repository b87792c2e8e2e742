"""OpenAI's eval templating: `{{item.field}}` and `{{sample.output_text}}` in a grader's prompt
are replaced by the item's and the sample's values (dotted paths reach into objects).

One pass, so a value that itself contains `{{...}}` (a rubric, a user's text) is inserted as it
is and never expanded. A name that is not there is an error naming it, never an empty string.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

_VARIABLE = re.compile(r"\{\{\s*([A-Za-z_][\w]*(?:\.[\w]+)*)\s*\}\}")
NAMESPACES = ("item", "sample")


class TemplateError(ValueError):
    """A `{{...}}` names a namespace or a field that the item or the sample does not have."""


def _lookup(namespaces: Mapping[str, Any], path: str) -> Any:
    head, *rest = path.split(".")
    if head not in namespaces:
        raise TemplateError(
            f"{{{{{path}}}}}: unknown namespace {head!r}; use one of {', '.join(NAMESPACES)}"
        )
    value: Any = namespaces[head]
    for depth, part in enumerate(rest, start=1):
        if isinstance(value, Mapping) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            where = ".".join([head, *rest[:depth]])
            raise TemplateError(f"{{{{{path}}}}}: {where} is not there")
    return value


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def render(template: str, *, item: Mapping[str, Any], sample: Mapping[str, Any]) -> str:
    """The template with each `{{namespace.path}}` replaced (non-strings as JSON)."""
    namespaces = {"item": item, "sample": sample}
    return _VARIABLE.sub(lambda m: _text(_lookup(namespaces, m.group(1))), template)

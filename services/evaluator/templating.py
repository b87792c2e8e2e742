"""OpenAI's eval templating, for every `{{item.x}}` / `{{sample.x}}` this service fills in: the
Evals API's criteria and prompt templates (checked when an eval or a run is created, filled in
per item when it is answered or graded) and the LLM judge's grader messages (judge.py).

A reference is a namespace (`item` or `sample`) and a dotted path into it; a number segment
indexes a list (`{{item.turns.0}}`). A string value goes in as it is, anything else as JSON
with sorted keys (one text for one value, whatever order its keys came in: two objects compare
equal in a string_check, and the judge's verdict cache, keyed by the rendered prompt, hits).
One pass, so a value that itself contains `{{...}}` (a rubric, a user's text) is inserted as it
is and never expanded. A reference that is not there is an error naming it, never an empty
string.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

_VARIABLE = re.compile(r"\{\{\s*(.*?)\s*\}\}")
_PATH = re.compile(r"[A-Za-z_][\w-]*(\.[\w-]+)*")
NAMESPACES = ("item", "sample")


class TemplateError(ValueError):
    """A reference that cannot be filled in; the message names it."""


def references(text: str) -> list[str]:
    return _VARIABLE.findall(text)


def check(
    text: str, *, item_properties: Iterable[str] | None, sample: bool, where: str = "template"
) -> None:
    """Raise TemplateError unless every reference in `text` names `item.<field>` (one of
    `item_properties` when the item schema lists them) or, when `sample`, `sample.<field>`."""
    known = set(item_properties) if item_properties is not None else None
    for reference in references(text):
        namespace, _, path = reference.partition(".")
        if not _PATH.fullmatch(reference) or namespace not in NAMESPACES or not path:
            raise TemplateError(
                f"{{{{{reference}}}}} in the {where} is not a reference: use {{{{item.<field>}}}}"
                " or {{sample.output_text}}"
            )
        if namespace == "sample" and not sample:
            raise TemplateError(
                f"{{{{{reference}}}}}: this eval has no sample namespace (set "
                "data_source_config.include_sample_schema to true for runs where a model answers)"
            )
        field = path.split(".", 1)[0]
        if namespace == "item" and known is not None and field not in known:
            names = ", ".join(sorted(known)) or "none"
            raise TemplateError(
                f"{{{{{reference}}}}}: the item schema has no property {field!r} (it has {names})"
            )


def lookup(reference: str, context: Mapping[str, Any]) -> Any:
    """The value `namespace.path` names in `context` ({"item": ..., "sample": ...});
    TemplateError when the namespace is not one or the value is not there."""
    namespace = reference.split(".", 1)[0]
    if namespace not in NAMESPACES:
        raise TemplateError(
            f"{{{{{reference}}}}}: unknown namespace {namespace!r}; use one of "
            f"{', '.join(NAMESPACES)}"
        )
    value: Any = context
    walked = []
    for segment in reference.split("."):
        walked.append(segment)
        if isinstance(value, Mapping) and segment in value:
            value = value[segment]
        elif isinstance(value, list) and segment.isdigit() and int(segment) < len(value):
            value = value[int(segment)]
        else:
            raise TemplateError(f"{{{{{reference}}}}}: {'.'.join(walked)} is not in this item")
    return value


def as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def render(text: str, context: Mapping[str, Any]) -> str:
    """`text` with every reference filled in from `context` ({"item": ..., "sample": ...})."""
    return _VARIABLE.sub(lambda match: as_text(lookup(match.group(1), context)), text)


def sample_context(sample: Mapping[str, Any]) -> dict[str, Any]:
    """The `sample` namespace: what was given or generated, plus `output_text` (the answer's
    text), `output_json` (that text parsed, null when it is not JSON) and `output_tools`."""
    context = dict(sample)
    if "output_text" not in context:
        outputs = context.get("output") or [{}]
        first = outputs[0] if isinstance(outputs, list) and outputs else {}
        content = first.get("content") if isinstance(first, Mapping) else None
        context["output_text"] = content if isinstance(content, str) else ""
        calls = first.get("tool_calls") if isinstance(first, Mapping) else None
        context.setdefault("output_tools", calls or [])
    if "output_json" not in context and isinstance(context["output_text"], str):
        try:
            context["output_json"] = json.loads(context["output_text"])
        except ValueError:
            context["output_json"] = None
    return context

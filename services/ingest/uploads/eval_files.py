"""Uploads with purpose `evals`: OpenAI's eval file format, one `{"item": {...}}` a line (with an
optional `"sample": {...}`: a given answer), checked line by line and kept as uploaded. They are
never imported as samples: an eval item is a question to grade a model on, not traffic to train
on (and most are not chat samples at all). The evaluator's Evals API reads them by file id.

The first bad line fails the file (`status: error`, its `status_details` naming the line), as
OpenAI's file validation does: a run over half a file would grade the wrong set without saying so.
"""

from __future__ import annotations

from typing import Any, BinaryIO

import orjson

PURPOSE = "evals"
_FIELDS = ("item", "sample")


class BadEvalLine(ValueError):
    """A line that is not an eval item; the message names the line and the field."""


def check_line(raw: bytes, number: int) -> None:
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadEvalLine(f"line {number}: not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise BadEvalLine(f'line {number}: not a JSON object; a line is {{"item": {{...}}}}')
    if not isinstance(value.get("item"), dict):
        found = "missing" if "item" not in value else f"a {type(value['item']).__name__}"
        raise BadEvalLine(f'line {number}: "item": must be a JSON object ({found})')
    unknown = sorted(set(value) - set(_FIELDS))
    if unknown:
        raise BadEvalLine(
            f"line {number}: {', '.join(repr(k) for k in unknown)}: unknown; a line holds "
            '"item" and, optionally, "sample"'
        )
    if "sample" in value and not isinstance(value["sample"], dict):
        raise BadEvalLine(f'line {number}: "sample": must be a JSON object')


def check_file(handle: BinaryIO) -> dict[str, Any]:
    """The upload's outcome, as its row's fields: processed with the count of items, or an
    error naming the first bad line. Blocking (reads the spooled file): run it in a thread."""
    items = 0
    try:
        for number, raw in enumerate(handle, 1):
            if raw.strip():
                check_line(raw, number)
                items += 1
        if items == 0:
            raise BadEvalLine("the file holds no items")
    except BadEvalLine as exc:
        return {"status": "error", "status_details": str(exc)[:2000]}
    return {"status": "processed", "status_details": f"{items} eval items"}

"""Reading a judge's reply: the first JSON object in it (the whole reply, a ```json fence, or one
embedded in prose: small models add words around it), and the fields a verdict needs. What
cannot be used raises Unreadable, whose message is quoted back to the judge on its retry."""

from __future__ import annotations

import contextlib
import json
import re
from typing import Any


class Unreadable(ValueError):
    """The judge's reply cannot be used; the message says why (it is quoted back on the retry)."""


_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)


def json_object(text: str) -> dict[str, Any]:
    """The first JSON object in the reply: the whole reply, a ```json fence, or one embedded in
    prose (small models add words around it)."""
    candidates = [text.strip(), *(m.group(1).strip() for m in _FENCE.finditer(text))]
    for candidate in candidates:
        try:
            value = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    decoder = json.JSONDecoder()
    for start in (i for i, c in enumerate(text) if c == "{"):
        try:
            value, _ = decoder.raw_decode(text, start)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    raise Unreadable("the reply holds no JSON object")


def _assessment(obj: dict[str, Any]) -> str:
    assessment = obj.get("assessment")
    if not isinstance(assessment, str) or not assessment.strip():
        raise Unreadable('"assessment": missing; write one or two sentences on why')
    return assessment.strip()


def read_score(text: str, low: float, high: float) -> tuple[float, str]:
    obj = json_object(text)
    score = obj.get("score")
    if isinstance(score, str):
        with contextlib.suppress(ValueError):
            score = float(score.strip())
    if isinstance(score, bool) or not isinstance(score, int | float):
        raise Unreadable(f'"score": {score!r} is not a number from {low:g} to {high:g}')
    if not low <= float(score) <= high:
        raise Unreadable(f'"score": {score!r} is outside the range {low:g} to {high:g}')
    return float(score), _assessment(obj)


def read_label(text: str, labels: list[str]) -> tuple[str, str]:
    obj = json_object(text)
    label = obj.get("label")
    if not isinstance(label, str) or label.strip() not in labels:
        raise Unreadable(f'"label": {label!r} is not one of {json.dumps(labels)}')
    return label.strip(), _assessment(obj)

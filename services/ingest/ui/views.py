"""The dashboard's HTML: the Jinja2 environment (autoescaped), its filters, and the headers every
page carries (a Content-Security-Policy that runs only our own static scripts, no framing, no
caching of a tenant's data)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.templating import Jinja2Templates

HERE = Path(__file__).parent
STATIC_DIR = HERE / "static"
templates = Jinja2Templates(directory=HERE / "templates")

# No inline script or style anywhere: the charts' data comes as JSON from /ui routes, and their
# settings from data- attributes.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'; "
        "object-src 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def secured(response: Response) -> Response:
    response.headers.update(SECURITY_HEADERS)
    return response


def page(request: Request, template: str, context: dict[str, Any], status: int = 200) -> Response:
    response = templates.TemplateResponse(request, template, context, status_code=status)
    return secured(response)


def data(body: dict[str, Any], status: int = 200) -> Response:
    return secured(JSONResponse(body, status_code=status))


def html(text: str, status: int) -> Response:
    return secured(HTMLResponse(text, status_code=status))


# --- filters ------------------------------------------------------------------------------------


NONE = "\u2013"  # an en dash where a value is missing


def when(unix: int | float | None) -> str:
    if unix is None:
        return NONE
    return datetime.fromtimestamp(unix, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def score(value: object) -> str:
    """Three decimals; a dash for a value missing (null, or a field the object does not have)."""
    return f"{value:.3f}" if isinstance(value, int | float) else NONE


def compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "), default=str)


def content_text(content: Any) -> str:
    """A chat message's content as text: a string, or the text of its parts (others named)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            str(part.get("text", "")) if part.get("type") in ("text", None) else f"[{part['type']}]"
            for part in content
            if isinstance(part, dict)
        )
    return "" if content is None else compact(content)


def conversation(prompt: dict[str, Any]) -> list[tuple[str, str]]:
    """(role, text) of each message of an eval item's input."""
    return [
        (str(m.get("role", "?")), content_text(m.get("content")))
        for m in prompt.get("messages", [])
        if isinstance(m, dict)
    ]


def assessment(detail: dict[str, Any]) -> str:
    """Why an item scored what it did: the judge's words, its error, else the grader's detail."""
    judge = detail.get("judge")
    if isinstance(judge, dict) and judge.get("assessment"):
        return str(judge["assessment"])
    if detail.get("judge_error"):
        return f"judge error: {detail['judge_error']}"
    return compact(detail) if detail else ""


def answer_text(output: dict[str, Any]) -> str:
    text = str(output.get("text") or "")
    calls = output.get("tool_calls") or []
    return text + (f" [tool calls: {compact(calls)}]" if calls else "")


def stat_rows(stats: dict[str, Any]) -> list[tuple[str, str, str]]:
    """A dataset's stats as rows of (what, train, eval): each nested figure on one line, a
    group of plain numbers (percentiles, counts by kind) as `name value` pairs."""
    flat = {split: _flatten(stats.get(split) or {}) for split in ("train", "eval")}
    paths = list(dict.fromkeys([*flat["train"], *flat["eval"]]))
    return [(path, flat["train"].get(path, NONE), flat["eval"].get(path, NONE)) for path in paths]


def _flatten(value: dict[str, Any], prefix: str = "") -> dict[str, str]:
    if all(not isinstance(v, dict) for v in value.values()) and prefix:
        return {prefix: " · ".join(f"{k or '(none)'} {v}" for k, v in value.items()) or NONE}
    rows: dict[str, str] = {}
    for key, item in value.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        rows.update(_flatten(item, path) if isinstance(item, dict) else {path: str(item)})
    return rows


templates.env.filters.update(
    when=when, score=score, compact=compact, content_text=content_text, answer_text=answer_text
)
templates.env.globals.update(conversation=conversation, assessment=assessment, stat_rows=stat_rows)

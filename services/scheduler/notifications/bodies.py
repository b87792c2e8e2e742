"""The bodies a rule sends: `json` (ours, in Standard Webhooks' {type, timestamp, data} shape)
or `slack` (what a Slack incoming webhook takes: `text`, the fallback of notifications, and
Block Kit `blocks`).

    {"type": "job.failed", "id": "msg_...", "timestamp": "2026-12-07T10:00:00+00:00",
     "tenant": "acme", "rule": {"id": "nr_...", "name": "on-call"},
     "title": "...", "text": "...", "facts": {"Job": "ftjob-...", ...}, "data": {...}}
"""

from __future__ import annotations

import json
from typing import Any

from services.scheduler.notifications.matching import Alert
from services.scheduler.notifications.schemas import Format

# Slack's limits: a header's text, a section's text, a section's fields and each field.
_HEADER_MAX, _SECTION_MAX, _FIELDS_MAX, _FIELD_MAX = 150, 3000, 10, 2000


def render(format: Format, alert: Alert, *, message_id: str, rule_id: str, rule_name: str) -> bytes:
    body = (
        slack(alert, rule_name=rule_name)
        if format == "slack"
        else ours(alert, message_id=message_id, rule_id=rule_id, rule_name=rule_name)
    )
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


def ours(alert: Alert, *, message_id: str, rule_id: str, rule_name: str) -> dict[str, Any]:
    return {
        "type": alert.event,
        "id": message_id,
        "timestamp": alert.occurred_at.isoformat(),
        "tenant": alert.tenant,
        "rule": {"id": rule_id, "name": rule_name},
        "title": alert.title,
        "text": alert.text,
        "facts": dict(alert.facts),
        "data": alert.data,
    }


def slack(alert: Alert, *, rule_name: str) -> dict[str, Any]:
    section: dict[str, Any] = {
        "type": "section",
        "text": {"type": "mrkdwn", "text": _cut(_escape(alert.text), _SECTION_MAX)},
    }
    if alert.facts:
        section["fields"] = [
            {"type": "mrkdwn", "text": _cut(f"*{_escape(label)}*\n{_escape(value)}", _FIELD_MAX)}
            for label, value in alert.facts[:_FIELDS_MAX]
        ]
    context = (
        f"tuneloop · {alert.event} · rule {rule_name} · {alert.occurred_at:%Y-%m-%d %H:%M} UTC"
    )
    return {
        "text": f"{alert.title}: {alert.text}",
        "blocks": [
            {
                "type": "header",
                "text": {"type": "plain_text", "text": _cut(alert.title, _HEADER_MAX)},
            },
            section,
            {"type": "context", "elements": [{"type": "mrkdwn", "text": _escape(context)}]},
        ],
    }


def _escape(text: str) -> str:
    """Slack's mrkdwn control characters, as its docs ask."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"

"""Canonical samples for the evaluator's tests: a JSON extraction task, one ticket a sample."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from shared.chat import Sample

SYSTEM = "Extract the ticket as JSON with the fields id and team."


def reference(n: int) -> str:
    return json.dumps({"id": n, "team": ["billing", "shipping", "returns"][n % 3]})


def ticket(n: int, *, tenant: str = "acme", answered: bool = True) -> Sample:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"Ticket {n}: please route me."},
    ]
    if answered:
        messages.append({"role": "assistant", "content": reference(n)})
    return Sample.model_validate(
        {
            "tenant": tenant,
            "source": "upload",
            "source_ref": f"file-eval:{n}",
            "created_at": datetime(2026, 1, 1, tzinfo=UTC),
            "messages": messages,
        }
    )


def with_tool_call(n: int, *, tenant: str = "acme") -> Sample:
    return Sample.model_validate(
        {
            "tenant": tenant,
            "source": "upload",
            "source_ref": f"file-tools:{n}",
            "created_at": datetime(2026, 1, 1, tzinfo=UTC),
            "messages": [
                {"role": "user", "content": f"Weather in city {n}?"},
                {
                    "role": "assistant",
                    "tool_calls": [{"name": "weather", "arguments": json.dumps({"city": n})}],
                },
            ],
            "tools": [{"name": "weather", "parameters": {"type": "object"}}],
        }
    )

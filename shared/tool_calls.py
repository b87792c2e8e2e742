"""Tool calls read back from a model's text, as the chat template it was trained with writes
them: `<tool_call>{"name": ..., "arguments": ...}</tool_call>` blocks, the Hermes/Qwen convention
of the trainer's `CHATML_TOOLS_TEMPLATE` (services/trainer/rendering.py) and of models whose own
templates use it; what vLLM's `hermes` tool parser reads. The CPU engine answers a request
that offered tools with these calls in OpenAI's `tool_calls`, as a provider would.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

_TOOL_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.DOTALL)


def read_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """The answer's text outside `<tool_call>` blocks (None when nothing is left) and its calls
    in OpenAI's shape (`arguments` a JSON string). A block that is not a JSON object with a
    `name` stays in the text: the model wrote it, and dropping it would hide what it said."""
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    at = 0
    for match in _TOOL_CALL.finditer(text):
        try:
            call = json.loads(match.group(1))
        except json.JSONDecodeError:
            continue
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            continue
        arguments = call.get("arguments", {})
        kept.append(text[at : match.start()])
        at = match.end()
        encoded = arguments if isinstance(arguments, str) else json.dumps(arguments)
        calls.append(
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {"name": call["name"], "arguments": encoded},
            }
        )
    kept.append(text[at:])
    rest = "".join(kept).strip()
    return (rest or None), calls

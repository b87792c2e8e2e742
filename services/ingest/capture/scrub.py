"""Secrets out of captured samples, before they are published or stored.

Prompts carry what users paste: an API key in a debugging question, a bearer token in a curl
line. Every text a sample keeps (text parts, tool-call arguments, reasoning, refusals) goes
through shared.redact, so a key never reaches the sample store or a dataset. PII redaction
(emails, phone numbers) is a dataset cleaning step, chosen per dataset; secrets are always
removed here.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel

from shared.chat import Message, ReasoningBlock, Sample, TextPart, ToolCall
from shared.redact import redact_text

M = TypeVar("M", bound=BaseModel)


def _scrub_message(message: Message) -> tuple[Message, bool]:
    # Models are copied only where a text changed: nearly every message is clean, and copying
    # each part of each sample cost more than the redaction itself. Lists are rebuilt only then
    # too, and empty ones (most messages have no tool calls or reasoning) are skipped outright.
    update: dict[str, Any] = {}
    content = _changed(message.content, TextPart, "text")
    if content is not None:
        update["content"] = content
    if message.tool_calls:
        calls = _changed(message.tool_calls, ToolCall, "arguments")
        if calls is not None:
            update["tool_calls"] = calls
    if message.reasoning:
        reasoning = _changed(message.reasoning, ReasoningBlock, "text")
        if reasoning is not None:
            update["reasoning"] = reasoning
    if message.refusal and (refusal := redact_text(message.refusal)) != message.refusal:
        update["refusal"] = refusal
    return (message.model_copy(update=update), True) if update else (message, False)


def _changed(items: list[Any], kind: type[BaseModel], field: str) -> list[Any] | None:
    """`items` with `field` of each `kind` member redacted, or None when nothing changed."""
    for i, item in enumerate(items):
        if isinstance(item, kind) and (clean := _redacted(item, field)) is not item:
            rest = [_redacted(o, field) if isinstance(o, kind) else o for o in items[i + 1 :]]
            return [*items[:i], clean, *rest]
    return None


def _redacted(model: M, field: str) -> M:
    """`model` with `field` redacted: a copy when that changed something, else `model` itself."""
    text = getattr(model, field)
    if text is None:
        return model
    clean = redact_text(text)
    return model if clean == text else model.model_copy(update={field: clean})


def scrub_secrets(sample: Sample) -> Sample:
    """The sample with every secret-looking string replaced by [REDACTED] (the same object when clean)."""
    scrubbed = [_scrub_message(message) for message in sample.messages]
    if not any(changed for _, changed in scrubbed):
        return sample
    return sample.model_copy(update={"messages": [message for message, _ in scrubbed]})

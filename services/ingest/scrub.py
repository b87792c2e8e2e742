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

from shared.chat import Message, Sample, TextPart
from shared.redact import redact_text

M = TypeVar("M", bound=BaseModel)


def _scrub_message(message: Message) -> tuple[Message, bool]:
    # Models are copied only where a text changed: nearly every message is clean, and copying
    # each part of each sample cost more than the redaction itself.
    update: dict[str, Any] = {}
    content = [
        _redacted(part, "text") if isinstance(part, TextPart) else part for part in message.content
    ]
    if any(new is not old for new, old in zip(content, message.content, strict=True)):
        update["content"] = content
    calls = [_redacted(call, "arguments") for call in message.tool_calls]
    if any(new is not old for new, old in zip(calls, message.tool_calls, strict=True)):
        update["tool_calls"] = calls
    reasoning = [_redacted(block, "text") for block in message.reasoning]
    if any(new is not old for new, old in zip(reasoning, message.reasoning, strict=True)):
        update["reasoning"] = reasoning
    if message.refusal and (refusal := redact_text(message.refusal)) != message.refusal:
        update["refusal"] = refusal
    return (message.model_copy(update=update), True) if update else (message, False)


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

"""PII redaction: emails, phone numbers, payment card numbers and secrets become typed
placeholders (`[EMAIL]`, `[PHONE]`, `[CARD]`; secrets `[REDACTED]`, as ingest and the logs
write them) in every text a sample keeps: text parts, tool-call arguments (string values only,
so they stay valid JSON), reasoning and refusals.

Precision comes first (redacting a price or an order number corrupts training data):
- secrets: `shared.redact` (provider keys, tokens, `password=...`). Ingest scrubs most of them
  already; what is left (an uploaded file, `"password": ...` in tool arguments) is counted.
- emails: `local@domain.tld`.
- cards: 13-19 digits, optionally grouped by spaces or dashes, that pass the Luhn check.
- phones: an international number (`+` and 8-15 digits, grouping allowed), a North American
  one with separators (`(415) 555-0123`, `415-555-0123`, `415.555.0123`) or a French/European
  `0X XX XX XX XX`. Bare digit runs (ids, timestamps) are left alone.
Each pattern is gated by a cheap scan (an `@`; a run of 8+ digits and separators), so ordinary
text costs one pass of each.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import orjson

from services.ingest.datasets.cleaning.report import StepReport
from shared.chat import ContentPart, Message, Sample, TextPart
from shared.redact import REDACTED, redact_mapping, redact_text

PLACEHOLDERS = {
    "email": "[EMAIL]",
    "phone": "[PHONE]",
    "card": "[CARD]",
    # The placeholder ingest's secret scrubbing and the logs already use.
    "secret": REDACTED,
}
_EMAIL = re.compile(
    r"(?<![\w.+-])[A-Za-z0-9][A-Za-z0-9._%+-]{0,63}@[A-Za-z0-9](?:[A-Za-z0-9-]{0,62}\.)+[A-Za-z]{2,24}\b"
)
_CARD = re.compile(r"(?<![\d-])\d(?:[ -]?\d){12,18}(?![\d-])")
_PHONE = re.compile(
    r"(?<![\w+])\+\d{1,3}(?:[ .-]?\(?\d{1,4}\)?){2,5}(?![\d-])"
    r"|(?<![\w(.-])(?:\(\d{3}\) ?|\d{3}[.-])\d{3}[.-]\d{4}(?![\d-])"
    r"|(?<![\w.-])0\d(?:[ .]\d\d){4}(?![\d.-])"
)
_NUMBER_RUN = re.compile(r"\d[\d ().-]{6,}\d")


def luhn_ok(digits: str) -> bool:
    total = 0
    for i, char in enumerate(reversed(digits)):
        d = ord(char) - 48
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _card(match: re.Match[str]) -> str | None:
    digits = re.sub(r"[ -]", "", match.group())
    return PLACEHOLDERS["card"] if 13 <= len(digits) <= 19 and luhn_ok(digits) else None


def _phone(match: re.Match[str]) -> str | None:
    digits = sum(c.isdigit() for c in match.group())
    return PLACEHOLDERS["phone"] if 8 <= digits <= 15 else None


def _sub(pattern: re.Pattern[str], text: str, kind: str, counts: Counter[str]) -> str:
    text, found = pattern.subn(PLACEHOLDERS[kind], text)
    if found:
        counts[kind] += found
    return text


def _number_spans(
    text: str, start: int, end: int, counts: Counter[str]
) -> list[tuple[int, int, str]]:
    """Card and phone numbers inside one run of digits and separators (cards first: a grouped
    card number also looks like a phone number)."""
    spans = []
    for match in _CARD.finditer(text, start, end):
        if (placeholder := _card(match)) is not None:
            spans.append((match.start(), match.end(), placeholder))
            counts["card"] += 1
    for match in _PHONE.finditer(text, start, end):
        clash = any(s < match.end() and match.start() < e for s, e, _ in spans)
        if not clash and (placeholder := _phone(match)) is not None:
            spans.append((match.start(), match.end(), placeholder))
            counts["phone"] += 1
    return sorted(spans)


def _redact_numbers(text: str, counts: Counter[str]) -> str:
    # One scan for runs of 8+ digits/separators; the precise patterns run inside those only
    # (their look-behinds still see the text before the run).
    pieces: list[str] = []
    last = 0
    for run in _NUMBER_RUN.finditer(text):
        start = run.start()
        while start > last and text[start - 1] in "+(":
            start -= 1
        for span_start, span_end, placeholder in _number_spans(text, start, run.end(), counts):
            pieces += (text[last:span_start], placeholder)
            last = span_end
    if not pieces:
        return text
    pieces.append(text[last:])
    return "".join(pieces)


def redact_pii(text: str, counts: Counter[str]) -> str:
    """`text` with PII replaced by placeholders; adds what it replaced to `counts`."""
    if not text:
        return text
    redacted = redact_text(text)
    if redacted != text:
        counts["secret"] += redacted.count(REDACTED) - text.count(REDACTED)
        text = redacted
    if "@" in text:
        text = _sub(_EMAIL, text, "email", counts)
    return _redact_numbers(text, counts)


def _redact_strings(value: Any, counts: Counter[str]) -> Any:
    if isinstance(value, str):
        return redact_pii(value, counts)
    if isinstance(value, list):
        return [_redact_strings(item, counts) for item in value]
    if isinstance(value, dict):
        return {key: _redact_strings(item, counts) for key, item in value.items()}
    return value


def _redact_arguments(arguments: str, counts: Counter[str]) -> str:
    """Tool-call arguments: values under secret-looking keys (`password`) first, then every
    string value; re-encoded only when something changed, so they stay valid JSON."""
    value = orjson.loads(arguments)
    found: Counter[str] = Counter()
    secured = redact_mapping(value)
    if secured != value:
        found["secret"] += orjson.dumps(secured).decode().count(REDACTED) - arguments.count(
            REDACTED
        )
    redacted = _redact_strings(secured, found)
    if redacted == value:
        return arguments
    counts.update(found)
    return orjson.dumps(redacted).decode()


def _redact_parts(message: Message, counts: Counter[str]) -> list[ContentPart] | None:
    changed = False
    content: list[ContentPart] = []
    for part in message.content:
        if isinstance(part, TextPart) and (text := redact_pii(part.text, counts)) != part.text:
            part = part.model_copy(update={"text": text})
            changed = True
        content.append(part)
    return content if changed else None


def _redact_message(message: Message, counts: Counter[str]) -> Message:
    update: dict[str, Any] = {}
    if (content := _redact_parts(message, counts)) is not None:
        update["content"] = content
    calls = [
        call.model_copy(update={"arguments": _redact_arguments(call.arguments, counts)})
        for call in message.tool_calls
    ]
    if any(n.arguments != o.arguments for n, o in zip(calls, message.tool_calls, strict=True)):
        update["tool_calls"] = calls
    reasoning = [
        b.model_copy(update={"text": redact_pii(b.text, counts)}) for b in message.reasoning
    ]
    if any(n.text != o.text for n, o in zip(reasoning, message.reasoning, strict=True)):
        update["reasoning"] = reasoning
    if message.refusal and (refusal := redact_pii(message.refusal, counts)) != message.refusal:
        update["refusal"] = refusal
    return message.model_copy(update=update) if update else message


def redact_samples(samples: list[Sample]) -> tuple[list[Sample], StepReport, dict[str, int]]:
    """Redact every sample; the report counts changed samples, the dict redactions per kind."""
    counts: Counter[str] = Counter()
    out: list[Sample] = []
    kinds: Counter[str] = Counter()
    for sample in samples:
        found: Counter[str] = Counter()
        messages = [_redact_message(m, found) for m in sample.messages]
        if found:
            sample = sample.model_copy(update={"messages": messages})
            kinds.update(found.keys())
            counts.update(found)
        out.append(sample)
    changed = sum(1 for new, old in zip(out, samples, strict=True) if new is not old)
    changes = Counter({f"pii_{kind}": n for kind, n in kinds.items()})
    report = StepReport.of("redact_pii", len(samples), Counter(), changed, changes)
    return out, report, {kind: counts[kind] for kind in PLACEHOLDERS if counts[kind]}

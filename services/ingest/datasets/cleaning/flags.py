"""Flags for outputs a model should not learn from: refusals, truncated outputs and format
errors. Flagged samples are dropped, or kept and tagged `flag:<kind>` when asked.

Refusal heuristic (precision first, since a false hit throws away a good sample):
- the assistant message carries a `refusal` (OpenAI structured refusals), or
- the upstream stopped with finish_reason `content_filter`, or
- an assistant turn OPENS with a refusal formula ("I'm sorry, but I can't ...", "I cannot help
  with ...", "As an AI language model, I ...", "I apologize, but I won't ..."). The phrase must
  be at the start of the turn: "I can't wait to help" or an answer that later says "I cannot
  stress enough" is not a refusal, and neither is a quoted refusal in the middle of a text.
  Turns with `weight: 0` (not trained on) are not looked at.
Truncated: finish_reason `length`. Format error: the request asked for JSON (`response_format`
of type json_object / json_schema) or the dataset says `expect_json`, and the final assistant
text does not parse as JSON (a turn of tool calls only has no text to check).
"""

from __future__ import annotations

import re
from collections import Counter

import orjson

from services.ingest.datasets.cleaning.report import StepReport
from shared.chat import Message, Sample

FLAG_KINDS = ("refusal", "truncated", "format_error")
_APOSTROPHES = str.maketrans({"\u2019": "'", "\u2018": "'"})
_CANT = r"(?:can ?not|can't|won't|will not|am unable to|am not able to|'m unable to|'m not able to)"
_ACTION = (
    r"(?:help|assist|comply|provide|fulfil|fulfill|do that|do this|create|generate|write|"
    r"answer|engage|support|share|give|produce|complete|process|participate|discuss)"
)
_REFUSAL = re.compile(
    r"^\W*(?:"
    rf"(?:i'm |i am )?(?:so |very )?sorry,? (?:but )?i {_CANT}"
    rf"|i apologi[sz]e,? (?:but )?i {_CANT}"
    rf"|(?:unfortunately,? )?i {_CANT} {_ACTION}"
    r"|as an ai(?: language model| assistant)?,? i (?:can ?not|can't|don't|do not|am not)"
    r")"
)


def is_refusal_text(text: str) -> bool:
    return _REFUSAL.match(text[:300].lower().translate(_APOSTROPHES)) is not None


def _refused(sample: Sample) -> bool:
    if sample.response is not None and sample.response.finish_reason == "content_filter":
        return True
    return any(
        m.role == "assistant" and m.weight != 0 and (m.refusal or is_refusal_text(m.text()))
        for m in sample.messages
    )


def wants_json(sample: Sample, expect_json: bool) -> bool:
    if expect_json:
        return True
    fmt = sample.params.response_format
    return isinstance(fmt, dict) and fmt.get("type") in ("json_object", "json_schema")


def _bad_json(final: Message | None) -> bool:
    if final is None or not (text := final.text().strip()):
        return False
    try:
        orjson.loads(text)
    except orjson.JSONDecodeError:
        return True
    return False


def sample_flags(
    sample: Sample, *, refusals: bool, truncated: bool, expect_json: bool
) -> list[str]:
    """The flags a sample raises, in FLAG_KINDS order."""
    found = []
    if refusals and _refused(sample):
        found.append("refusal")
    if truncated and sample.response is not None and sample.response.finish_reason == "length":
        found.append("truncated")
    if wants_json(sample, expect_json) and _bad_json(sample.completion()):
        found.append("format_error")
    return found


def flag_samples(
    samples: list[Sample],
    *,
    refusals: bool,
    truncated: bool,
    expect_json: bool,
    keep: bool,
) -> tuple[list[Sample], StepReport, dict[str, int]]:
    """Drop flagged samples (reason: their first flag), or tag and keep them with `keep`.
    The dict counts flagged samples per kind (a sample with two flags counts under both)."""
    kept: list[Sample] = []
    removed: Counter[str] = Counter()
    tagged: Counter[str] = Counter()
    flagged: Counter[str] = Counter()
    changed = 0
    for sample in samples:
        found = sample_flags(
            sample, refusals=refusals, truncated=truncated, expect_json=expect_json
        )
        flagged.update(found)
        if not found:
            kept.append(sample)
        elif not keep:
            removed[found[0]] += 1
        else:
            tags = [f"flag:{kind}" for kind in found if f"flag:{kind}" not in sample.tags]
            if tags:
                sample = sample.model_copy(update={"tags": [*sample.tags, *tags]})
                tagged.update(tags)
                changed += 1
            kept.append(sample)
    report = StepReport.of("flags", len(samples), removed, changed, tagged)
    return kept, report, {kind: flagged[kind] for kind in FLAG_KINDS if flagged[kind]}

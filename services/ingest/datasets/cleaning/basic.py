"""Structural cleaning: empty messages and samples, and samples too long for the base model."""

from __future__ import annotations

from collections import Counter
from itertools import accumulate
from typing import Literal

from services.ingest.datasets.cleaning.report import StepReport
from services.ingest.datasets.cleaning.tokens import TokenCounter
from shared.chat import Message, Sample, TextPart


def _is_empty(message: Message) -> bool:
    """No visible text, media, tool call or refusal. Tool results are never empty: even a blank
    one answers a call, and dropping it would unpair the call."""
    if message.role == "tool" or message.tool_calls or message.refusal:
        return False
    return all(isinstance(p, TextPart) and not p.text.strip() for p in message.content)


def drop_empty(samples: list[Sample]) -> tuple[list[Sample], StepReport]:
    """Remove empty messages; then drop samples with no prompt content left ("empty_prompt")
    or not ending with an assistant turn ("no_completion": nothing to learn from)."""
    kept: list[Sample] = []
    removed: Counter[str] = Counter()
    changed = 0
    for sample in samples:
        messages = [m for m in sample.messages if not _is_empty(m)]
        if not any(m.role != "assistant" for m in messages):
            removed["empty_prompt"] += 1
            continue
        if messages[-1].role != "assistant":
            removed["no_completion"] += 1
            continue
        if len(messages) != len(sample.messages):
            sample = sample.model_copy(update={"messages": messages})
            changed += 1
        kept.append(sample)
    changes = Counter({"empty_message": changed}) if changed else None
    return kept, StepReport.of("drop_empty", len(samples), removed, changed, changes)


def drop_overlong(
    samples: list[Sample],
    max_tokens: int,
    policy: Literal["drop", "truncate"],
    counter: TokenCounter,
) -> tuple[list[Sample], StepReport]:
    """Samples longer than max_tokens are dropped, or truncated: whole trailing turns go until
    the sample fits and still ends with an assistant turn; one that cannot is dropped."""
    # Only samples that might be too long are tokenised: tokenising is most of this step's cost.
    doubtful = {id(s) for s in samples if counter.upper_bound(s) > max_tokens}
    counter.prime_samples([s for s in samples if id(s) in doubtful])
    kept: list[Sample] = []
    removed: Counter[str] = Counter()
    changed = 0
    for sample in samples:
        if id(sample) not in doubtful:
            kept.append(sample)
            continue
        counts = counter.message_counts(sample)
        budget = max_tokens - counter.tools_count(sample)
        if sum(counts) <= budget:
            kept.append(sample)
            continue
        cut = _fitting_prefix(sample.messages, counts, budget) if policy == "truncate" else 0
        if cut == 0:
            removed["overlong"] += 1
            continue
        kept.append(sample.model_copy(update={"messages": sample.messages[:cut]}))
        changed += 1
    changes = Counter({"truncated_turns": changed}) if changed else None
    return kept, StepReport.of("overlong", len(samples), removed, changed, changes)


def _fitting_prefix(messages: list[Message], counts: list[int], budget: int) -> int:
    """Length of the longest prefix within budget that ends with an assistant turn after some
    prompt (0 when there is none)."""
    best = 0
    seen_prompt = False
    for i, (message, total) in enumerate(zip(messages, accumulate(counts), strict=True)):
        if total > budget:
            break
        seen_prompt = seen_prompt or message.role != "assistant"
        if message.role == "assistant" and seen_prompt:
            best = i + 1
    return best

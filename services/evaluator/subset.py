"""A job's fixed eval subset: read the dataset snapshot's eval split, pick a seeded sample of it.

The snapshot layout is ingest's (`<dataset_uri>/eval.jsonl`, canonical samples one a line, a
commit marker written last); it is read here, not imported. The pick is a function of the
dataset version and the size only (items ordered by sha256(version:sample id)), so every point
of a job, every job on the same dataset version, and a restarted evaluator get the same items.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from services.evaluator.graders import Answer
from shared.chat import ExportError, Sample, to_openai_messages
from shared.storage import ObjectStore

EVAL_FILE = "eval.jsonl"
MIN_ITEMS = 16
# max_tokens: the reference's estimated tokens (CHARS_PER_TOKEN, conservative for JSON and
# code) times HEADROOM plus SLACK, so an answer a little longer than the reference is not cut;
# capped so a base model that rambles costs a bounded time.
CHARS_PER_TOKEN = 3.0
HEADROOM = 2.0
SLACK = 16
MIN_TOKENS, MAX_TOKENS = 32, 1024


class SubsetError(ValueError):
    """The eval split cannot give a subset (not committed, a bad line, nothing to score)."""


@dataclass(frozen=True)
class EvalItem:
    """One prompt sent at every point, and the answer it is graded against."""

    position: int
    sample_id: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    reference: Answer
    max_tokens: int


def read_eval_split(store: ObjectStore, dataset_uri: str) -> list[Sample]:
    """The snapshot's eval samples. StorageError (S3 away) passes through; a snapshot that is not
    committed or holds a bad line is a SubsetError naming it."""
    prefix = dataset_uri.rstrip("/")
    if not store.is_committed(prefix):
        raise SubsetError(f"dataset_uri {dataset_uri}: no committed snapshot there")
    body = store.get_bytes(f"{prefix}/{EVAL_FILE}")
    samples = []
    for number, line in enumerate(body.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            samples.append(Sample.model_validate_json(line))
        except ValidationError as exc:
            raise SubsetError(f"{EVAL_FILE} line {number}: not a canonical sample: {exc}") from None
    return samples


def _rank(seed: str, sample_id: str) -> str:
    return hashlib.sha256(f"{seed}:{sample_id}".encode()).hexdigest()


def pick(samples: list[Sample], *, size: int, seed: str) -> list[Sample]:
    """`size` samples that end with an assistant turn, the same for the same seed and ids
    whatever the input order; all of them when there are fewer."""
    usable = [s for s in samples if s.completion() is not None]
    usable.sort(key=lambda s: (_rank(seed, s.id), s.id))
    return usable[:size]


def reference_of(sample: Sample) -> Answer:
    final = sample.completion()
    if final is None:
        raise SubsetError(f"sample {sample.id}: no final assistant turn to grade against")
    calls = tuple((call.name, call.arguments) for call in final.tool_calls)
    return Answer(text=final.text(), tool_calls=calls)


def max_tokens_for(reference: Answer) -> int:
    chars = len(reference.text) + sum(len(n) + len(a) + 8 for n, a in reference.tool_calls)
    estimate = HEADROOM * math.ceil(chars / CHARS_PER_TOKEN) + SLACK
    return int(min(MAX_TOKENS, max(MIN_TOKENS, estimate)))


def item_of(position: int, sample: Sample) -> EvalItem:
    """The prompt as the engine takes it (OpenAI chat messages and tools), the reference apart."""
    prompt = sample.model_copy(update={"messages": sample.prompt_messages()})
    try:
        record = to_openai_messages(prompt)
    except ExportError as exc:
        raise SubsetError(f"sample {sample.id}: {exc}") from None
    reference = reference_of(sample)
    return EvalItem(
        position=position,
        sample_id=sample.id,
        messages=record["messages"],
        tools=record.get("tools", []),
        reference=reference,
        max_tokens=max_tokens_for(reference),
    )


def build_subset(
    store: ObjectStore, *, dataset_uri: str, dataset_version: str, eval_items: int
) -> list[EvalItem]:
    """The job's items: max(eval_items, MIN_ITEMS) of the eval split (fewer if it is smaller).
    SubsetError when none can be scored; StorageError when S3 cannot be read (retry)."""
    samples = read_eval_split(store, dataset_uri)
    chosen = pick(samples, size=max(eval_items, MIN_ITEMS), seed=dataset_version)
    if not chosen:
        raise SubsetError(
            f"{EVAL_FILE} of {dataset_uri}: no sample ends with an assistant turn to grade"
        )
    return [item_of(position, sample) for position, sample in enumerate(chosen)]

"""Eval decontamination: train samples that share a word n-gram with an eval sample are removed,
so the eval set measures generalisation, not recall of its own answers.

Runs after the split, on the conversation text without system messages (lowercased words).
An n-gram found in more than `max_df` train samples is boilerplate (a prompt template, a
signature line), not leaked content, and is ignored: without that rule a template shared by the
whole dataset would contaminate every sample. Exact and near-duplicates are gone by then, and
the split already keeps samples with the same prompt on one side.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from services.ingest.datasets.cleaning.report import StepReport
from services.ingest.datasets.cleaning.text import WordCache, dialogue_text, ngram_hashes
from shared.chat import Sample


def contaminated_rows(
    train_texts: list[str],
    eval_texts: list[str],
    n: int,
    max_df: int,
    cache: WordCache | None = None,
) -> set[int]:
    """Indexes of train texts sharing a non-boilerplate word n-gram with any eval text."""
    cache = cache or WordCache()
    eval_grams, _ = ngram_hashes(*cache.flat(eval_texts), n)
    if not len(eval_grams) or not train_texts:
        return set()
    grams, rows = ngram_hashes(*cache.flat(train_texts), n)
    hit = _members(grams, np.unique(eval_grams))
    if not hit.any():
        return set()
    grams, rows = grams[hit], rows[hit]
    # Distinct (gram, row) pairs, then how many train rows hold each gram.
    order = np.lexsort((rows, grams))
    grams, rows = grams[order], rows[order]
    first = np.ones(len(grams), bool)
    first[1:] = (grams[1:] != grams[:-1]) | (rows[1:] != rows[:-1])
    grams, rows = grams[first], rows[first]
    _, inverse, df = np.unique(grams, return_inverse=True, return_counts=True)
    return {int(r) for r in np.unique(rows[df[inverse] <= max_df])}


_FILTER_BITS = 24


def _members(values: np.ndarray, sorted_set: np.ndarray) -> np.ndarray:
    """np.isin for a small sorted set: a 16 MB bitmap of the set's low bits rules out almost
    every value in one gather; binary search settles the few left."""
    mask = np.uint64((1 << _FILTER_BITS) - 1)
    bitmap = np.zeros(1 << _FILTER_BITS, bool)
    bitmap[sorted_set & mask] = True
    maybe = np.flatnonzero(bitmap[values & mask])
    at = np.minimum(np.searchsorted(sorted_set, values[maybe]), len(sorted_set) - 1)
    hit = np.zeros(len(values), bool)
    hit[maybe[sorted_set[at] == values[maybe]]] = True
    return hit


def decontaminate(
    train: list[Sample],
    eval_: list[Sample],
    n: int,
    max_df: int,
    cache: WordCache | None = None,
) -> tuple[list[Sample], StepReport]:
    """Train without contaminated samples. The step's samples_in counts train and eval (every
    sample that reached it), so the cleaning report still adds up to train + eval."""
    found = contaminated_rows(
        [dialogue_text(s) for s in train], [dialogue_text(s) for s in eval_], n, max_df, cache
    )
    kept = [s for i, s in enumerate(train) if i not in found]
    removed = Counter({"eval_overlap": len(found)}) if found else Counter[str]()
    return kept, StepReport.of("decontaminate", len(train) + len(eval_), removed)

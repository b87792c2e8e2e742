"""Exact and near-duplicate removal. Of each group of duplicates the earliest sample (by
created_at, then id) is kept, so the result does not depend on the order samples arrive in."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np
import rensa

from services.ingest.datasets.cleaning.report import StepReport
from services.ingest.datasets.cleaning.text import WordCache, dialogue_text, exact_key, ngram_hashes
from shared.chat import Sample

NUM_PERM = 128
SHINGLE_WORDS = 3
# Fixed forever: a different seed gives different MinHash permutations, so different decisions.
MINHASH_SEED = 20240601


def _chronological(samples: Sequence[Sample]) -> list[int]:
    return sorted(range(len(samples)), key=lambda i: (samples[i].created_at, samples[i].id))


def _keep(samples: list[Sample], drop: set[int]) -> list[Sample]:
    return [s for i, s in enumerate(samples) if i not in drop]


def dedup_exact(samples: list[Sample]) -> tuple[list[Sample], StepReport]:
    """Drop samples whose messages and tools are equal after whitespace/case normalisation."""
    seen: set[bytes] = set()
    drop: set[int] = set()
    for i in _chronological(samples):
        key = exact_key(samples[i])
        if key in seen:
            drop.add(i)
        seen.add(key)
    removed = Counter({"exact_duplicate": len(drop)}) if drop else Counter[str]()
    return _keep(samples, drop), StepReport.of("dedup_exact", len(samples), removed)


def bands_for(threshold: float, num_perm: int = NUM_PERM) -> int:
    """LSH bands whose S-curve rises well below `threshold` (high recall); candidate pairs are
    then verified on their estimated Jaccard, so false candidates cost only time."""
    for bands in (8, 16, 32, 64):
        rows = num_perm // bands
        if (1.0 / bands) ** (1.0 / rows) <= threshold - 0.15:
            return bands
    return num_perm // 2


def _digests(hashes: np.ndarray, counts: np.ndarray) -> np.ndarray:
    offsets = np.zeros(len(counts) + 1, np.uint64)
    np.cumsum(counts, out=offsets[1:])
    matrix = rensa.RMinHash.digest_matrix_from_flat_token_hashes(
        hashes, offsets, NUM_PERM, MINHASH_SEED
    )
    return np.asarray(matrix.to_rows(), dtype=np.uint32).reshape(len(counts), NUM_PERM)


def near_duplicates(
    texts: Sequence[str], threshold: float, cache: WordCache | None = None
) -> set[int]:
    """Indexes of texts that are near-duplicates (estimated Jaccard of word 3-gram shingles
    >= threshold) of an earlier text; texts without words are never duplicates."""
    words, offsets = (cache or WordCache()).flat(texts)
    hashes, rows = ngram_hashes(words, offsets, SHINGLE_WORDS, whole_short_rows=True)
    counts = np.bincount(rows, minlength=len(texts)).astype(np.uint64)
    offsets64 = np.zeros(len(texts) + 1, np.uint64)
    np.cumsum(counts, out=offsets64[1:])
    bands = bands_for(threshold)
    # Rust pre-filter: only rows sharing a band with another row can be duplicates.
    matrix = rensa.RMinHash.digest_matrix_from_flat_token_hashes(
        hashes, offsets64, NUM_PERM, MINHASH_SEED
    )
    flags = rensa.RMinHashLSH(threshold, NUM_PERM, bands).query_duplicate_flags_matrix_one_shot(
        matrix
    )
    candidates = [i for i, flagged in enumerate(flags) if flagged and counts[i] > 0]
    if not candidates:
        return set()
    mask = np.isin(rows, candidates)
    digests = _digests(hashes[mask], counts[candidates])
    return {candidates[j] for j in _verified_duplicates(digests, threshold, bands)}


def _verified_duplicates(digests: np.ndarray, threshold: float, bands: int) -> list[int]:
    """Rows (in order) whose digest agrees with an earlier kept row's in >= threshold of its
    positions; band buckets find the candidates."""
    width = digests.shape[1] // bands
    buckets: list[dict[bytes, list[int]]] = [{} for _ in range(bands)]
    duplicates = []
    for j, digest in enumerate(digests):
        keys = [digest[b * width : (b + 1) * width].tobytes() for b in range(bands)]
        others = {k for b, key in enumerate(keys) for k in buckets[b].get(key, ())}
        if any(np.mean(digests[k] == digest) >= threshold for k in sorted(others)):
            duplicates.append(j)
            continue
        for b, key in enumerate(keys):
            buckets[b].setdefault(key, []).append(j)
    return duplicates


def dedup_near(
    samples: list[Sample], threshold: float, cache: WordCache | None = None
) -> tuple[list[Sample], StepReport]:
    """Drop near-duplicates of the conversation text (system prompts left out: a long shared
    one would make every pair alike)."""
    order = _chronological(samples)
    found = near_duplicates([dialogue_text(samples[i]) for i in order], threshold, cache)
    drop = {order[j] for j in found}
    removed = Counter({"near_duplicate": len(drop)}) if drop else Counter[str]()
    return _keep(samples, drop), StepReport.of("dedup_near", len(samples), removed)

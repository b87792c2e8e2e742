"""Deterministic train/eval split: the same samples and seed give the same split whatever order
they arrive in, strata keep their proportions, and eval never shares a sample with train.

Samples are grouped first: samples with the same id or the same prompt (sibling choices of one
request, a question asked twice; compared like exact dedup, case and whitespace ignored, which
is coarser than prompt_fingerprint) form one group that goes to one side, so eval never
overlaps train by id, by content fingerprint or even by prompt. Each group gets a
rank, sha256(seed, its smallest id), and each stratum sends its lowest-ranked groups to eval
until its share of the eval size is reached. Adding samples later moves few others.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Sequence

from services.ingest.datasets.cleaning.text import prompt_key
from services.ingest.datasets.spec import SplitOptions, stratum_of
from shared.chat import Sample

AUTO_FRACTION = 0.1
AUTO_CAP = 1000


class SplitError(ValueError):
    """The split cannot be made as asked; the message names the field."""


def eval_count(total: int, eval_size: int | float | None) -> int:
    """How many samples go to eval for `split.eval_size` (see SplitOptions)."""
    if total == 0:
        raise SplitError(
            "no samples to split: the selection is empty or cleaning removed every sample"
        )
    if eval_size is None:
        return 0 if total < 2 else min(AUTO_CAP, max(1, round(total * AUTO_FRACTION)))
    count = eval_size if isinstance(eval_size, int) else max(1, round(total * eval_size))
    if count >= total:
        raise SplitError(
            f"split.eval_size: {eval_size} means {count} eval samples, but only {total} "
            "samples are left after cleaning (at least one must stay in train)"
        )
    return count


def _groups(samples: Sequence[Sample]) -> list[list[int]]:
    """Indexes grouped by shared id or prompt fingerprint (union-find), each group sorted."""
    parent = list(range(len(samples)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first: dict[str | bytes, int] = {}
    for i, sample in enumerate(samples):
        for key in (sample.id, prompt_key(sample)):
            if (j := first.setdefault(key, i)) != i:
                parent[find(i)] = find(j)
    members: dict[int, list[int]] = defaultdict(list)
    for i in range(len(samples)):
        members[find(i)].append(i)
    return list(members.values())


def _quotas(sizes: dict[str, int], total: int, count: int) -> dict[str, int]:
    """Split `count` over strata in proportion to their sizes (largest remainder)."""
    exact = {key: count * size / total for key, size in sizes.items()}
    quotas = {key: int(share) for key, share in exact.items()}
    left = count - sum(quotas.values())
    by_remainder = sorted(exact, key=lambda key: (quotas[key] - exact[key], key))
    for key in by_remainder[:left]:
        quotas[key] += 1
    return quotas


def _rank(seed: int, group_id: str) -> bytes:
    return hashlib.sha256(f"{seed}\0{group_id}".encode()).digest()


def split(samples: Sequence[Sample], options: SplitOptions) -> tuple[list[Sample], list[Sample]]:
    """(train, eval), each sorted by id."""
    ordered = sorted(samples, key=lambda s: s.id)
    count = eval_count(len(ordered), options.eval_size)
    strata: dict[str, list[list[int]]] = defaultdict(list)
    for group in _groups(ordered):
        strata[stratum_of(ordered[group[0]], options.stratify_by)].append(group)
    sizes = {key: sum(len(g) for g in groups) for key, groups in strata.items()}
    quotas = _quotas(sizes, len(ordered), count)
    in_eval: set[int] = set()
    for key in sorted(strata):
        taken = 0
        for group in sorted(strata[key], key=lambda g: _rank(options.seed, ordered[g[0]].id)):
            if taken + len(group) <= quotas[key]:
                in_eval.update(group)
                taken += len(group)
    if count and not in_eval:
        raise SplitError(
            f"split.eval_size: no eval set of at most {count} samples can be made without "
            "splitting samples that share a prompt"
        )
    train = [s for i, s in enumerate(ordered) if i not in in_eval]
    eval_ = [s for i, s in enumerate(ordered) if i in in_eval]
    return train, eval_

"""An eval set's refresh: the most recent samples its filter selects, none of them trained on.

Candidates come newest first from the sample store (the dataset filter, `dataset_select`).
A candidate is left out when a built dataset of the tenant has it in its train split, by sample
id or by prompt (`cleaning.text.prompt_key` of the candidate as captured and as scrubbed: a
train split holds scrubbed samples); when cleaning with the datasets' defaults drops it (blank,
no final assistant turn, a refusal, cut off by the length limit); when a newer item already
asks its prompt; when OpenAI's chat format cannot express it (the evaluator reads that format).
What is kept is scrubbed of PII as a dataset is. The walk stops once `size` items are taken, so
a refresh reads about as many samples as it keeps unless most are left out.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from services.ingest.datasets import select as dataset_select
from services.ingest.datasets.cleaning.pipeline import clean
from services.ingest.datasets.snapshots import TRAIN_FILE, openai_line
from services.ingest.datasets.spec import CleaningOptions, SampleFilter
from services.ingest.eval_sets import store as eval_sets
from services.ingest.eval_sets.store import EvalSetError, HeldItem, key_of
from services.ingest.models import DatasetRow, EvalSetVersionRow
from shared.chat import ExportError, Sample
from shared.db import session_scope
from shared.storage import ObjectStore

# The datasets' defaults, less what compares samples with each other: one prompt per eval set
# is kept below (the newest), and near-duplicates of other items are different questions.
CLEANING = CleaningOptions(dedup_exact=False, near_dup_threshold=None, decontaminate_ngram=None)
BATCH = 256


@dataclass
class TrainSplits:
    """Sample ids and prompt keys of every train split the tenant has built."""

    ids: set[str] = field(default_factory=set)
    keys: set[str] = field(default_factory=set)
    datasets: int = 0


def train_splits(engine: Engine, store: ObjectStore, *, tenant: str) -> TrainSplits:
    """Read from the built snapshots (immutable), so datasets built before eval sets existed
    count too."""
    with Session(engine) as session:
        statement = select(DatasetRow.uri).where(
            DatasetRow.tenant == tenant,
            DatasetRow.status == "built",
            col(DatasetRow.uri).is_not(None),
        )
        uris = {uri for uri in session.exec(statement) if uri}
    found = TrainSplits(datasets=len(uris))
    for uri in sorted(uris):
        body = store.get_bytes(f"{uri.rstrip('/')}/{TRAIN_FILE}")
        for line in body.splitlines():
            sample = Sample.from_json_bytes(line)
            found.ids.add(sample.id)
            found.keys.add(key_of(sample))
    return found


@dataclass
class _Pick:
    size: int
    train: TrainSplits
    chosen: list[HeldItem] = field(default_factory=list)
    prompts: set[str] = field(default_factory=set)
    removed: Counter[str] = field(default_factory=Counter)
    pii: Counter[str] = field(default_factory=Counter)
    scanned: int = 0
    beyond_size: int = 0

    @property
    def full(self) -> bool:
        return len(self.chosen) >= self.size

    def batch(self, candidates: list[Sample]) -> None:
        self.scanned += len(candidates)
        fresh = []
        for sample in candidates:
            if sample.id in self.train.ids or key_of(sample) in self.train.keys:
                self.removed["in_train"] += 1
            else:
                fresh.append(sample)
        captured = {sample.id: key_of(sample) for sample in fresh}
        cleaned, report = clean(fresh, CLEANING)
        for step in report.steps:
            if step.removed:
                self.removed[step.step] += step.removed
        self.pii.update(report.pii)
        for sample in sorted(cleaned, key=lambda s: (s.created_at, s.id), reverse=True):
            self._take(sample, captured[sample.id])

    def _take(self, sample: Sample, captured_key: str) -> None:
        if self.full:
            self.beyond_size += 1
        elif key_of(sample) in self.train.keys:  # equal to a (scrubbed) train sample once scrubbed
            self.removed["in_train"] += 1
        elif captured_key in self.prompts:
            self.removed["same_prompt"] += 1
        elif not _exportable(sample):
            self.removed["not_exportable"] += 1
        else:
            self.prompts.add(captured_key)
            self.chosen.append(HeldItem(sample, captured_key))


def _exportable(sample: Sample) -> bool:
    try:
        openai_line(sample)
    except ExportError:
        return False
    return True


def _batches(samples: Iterator[Sample]) -> Iterator[list[Sample]]:
    while batch := list(islice(samples, BATCH)):
        yield batch


def pick(
    engine: Engine, store: ObjectStore, *, tenant: str, source: SampleFilter, size: int
) -> tuple[list[HeldItem], dict[str, Any]]:
    """Up to `size` items, oldest first, and the report of what was looked at:
    `scanned == len(items) + sum(removed) + beyond_size`."""
    state = _Pick(size, train_splits(engine, store, tenant=tenant))
    candidates = dataset_select.iter_filtered(
        engine, tenant=tenant, selection=source, newest_first=True
    )
    for batch in _batches(candidates):
        state.batch(batch)
        if state.full:
            break
    chosen = sorted(state.chosen, key=lambda item: (item.sample.created_at, item.sample.id))
    report: dict[str, Any] = {
        "scanned": state.scanned,
        "removed": dict(sorted(state.removed.items())),
        "beyond_size": state.beyond_size,
        "pii": dict(sorted(state.pii.items())),
        "train_datasets": state.train.datasets,
        "oldest_sample_at": _unix(chosen[0].sample) if chosen else None,
        "newest_sample_at": _unix(chosen[-1].sample) if chosen else None,
    }
    return chosen, report


def _unix(sample: Sample) -> int:
    return int(sample.created_at.timestamp())


def refresh(
    engine: Engine, store: ObjectStore, *, tenant: str, eval_set_id: str
) -> EvalSetVersionRow:
    """Make the eval set's next version (EvalSetError: 404 unknown, 422 nothing to hold, 409
    refreshed meanwhile). `new_items` counts the samples the previous version did not hold."""
    with session_scope(engine) as session:
        row = eval_sets.get(session, tenant=tenant, eval_set_id=eval_set_id)
        previous = eval_sets.latest_sample_ids(session, row)
    source = SampleFilter.model_validate_json(row.source)
    chosen, report = pick(engine, store, tenant=tenant, source=source, size=row.size)
    if not chosen:
        raise EvalSetError(
            422,
            f"source: empty selection: of the {report['scanned']} samples the filter selects, "
            f"none can be held (left out: {report['removed'] or 'none'})",
        )
    report["new_items"] = sum(1 for item in chosen if item.sample.id not in previous)
    return eval_sets.save_version(engine, row, chosen, report)

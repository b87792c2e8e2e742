"""The trainer's data path: a dataset snapshot -> tokenized examples -> rows -> optimizer steps.

Order is a pure function of (seed, epoch): rows are shuffled once per epoch by a generator
seeded with both, so a run resumed at any `DataPosition` yields exactly the batches an
uninterrupted run would, and N ranks together see exactly the rows one process sees.

An optimizer step takes `micro_batch_size * gradient_accumulation_steps * world_size` rows; rank
r gets every world_size-th of them (rank-strided). The last step of an epoch keeps the rows left
over (a smaller step, no sample is skipped); the loss is normalised by the step's label tokens,
so a small step weighs its tokens like any other. Every rank gets the same number of
micro-batches; where a rank has no rows left it gets a one-token micro-batch without labels,
so its backward still joins the gradient all-reduce (a rank that skipped it would hang DDP).
"""

from __future__ import annotations

import logging
import math
import tempfile
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import torch
from pydantic import ValidationError
from transformers import PreTrainedTokenizerBase

from services.trainer.config import Hyperparameters
from services.trainer.packing import MaskFormat, PackedRow, collate, pack, unpacked_rows
from services.trainer.rendering import IGNORE_INDEX, Renderer, RenderError, TokenizedExample
from shared.chat import Sample, describe_errors
from shared.storage import IncompleteDirectory, ObjectNotFound, ObjectStore, parse_uri

log = logging.getLogger(__name__)

_MAX_REPORTED_ERRORS = 5


class DatasetError(ValueError):
    """The snapshot is missing or unreadable; the message names the file (and line)."""


@dataclass(frozen=True, order=True)
class DataPosition:
    epoch: int
    # Optimizer steps already taken within the epoch.
    step: int


@dataclass
class StepBatch:
    position: DataPosition  # where this step starts
    micro_batches: list[dict[str, torch.Tensor]]
    # Label tokens of the WHOLE optimizer step across all ranks: the loss divisor.
    step_label_tokens: int
    global_step: int  # 0-based index of this step in the run
    next_position: DataPosition  # what a checkpoint taken after this step stores
    # Non-pad input tokens of this rank's micro-batches, for tokens/s.
    num_tokens: int = 0
    rows: list[int] = field(default_factory=list)  # this rank's row indices (tests, debugging)


class TrainingData:
    """Rows of one dataset, cut into deterministic optimizer steps for one rank."""

    def __init__(
        self,
        examples: Sequence[TokenizedExample],
        hp: Hyperparameters,
        *,
        pad_token_id: int,
        rank: int = 0,
        world_size: int = 1,
        mask: MaskFormat = "bool",
        mask_dtype: torch.dtype = torch.float32,
    ) -> None:
        if not examples:
            raise ValueError("no training examples (every sample was dropped, or none given)")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in [0, {world_size})")
        self.hp, self.rank, self.world_size = hp, rank, world_size
        self._collate_args: dict[str, Any] = {
            "pad_token_id": pad_token_id,
            "mask": mask,
            "mask_dtype": mask_dtype,
        }
        self.rows: list[PackedRow] = (
            pack(examples, hp.max_seq_len) if hp.packing else unpacked_rows(examples)
        )
        self.global_batch = hp.micro_batch_size * hp.gradient_accumulation_steps * world_size
        self.steps_per_epoch = math.ceil(len(self.rows) / self.global_batch)
        every_epoch = hp.epochs * self.steps_per_epoch
        self.total_steps = min(every_epoch, hp.max_steps) if hp.max_steps else every_epoch
        self.stats = _stats(examples, self.rows, hp.max_seq_len, self.steps_per_epoch)

    def epoch_order(self, epoch: int) -> np.ndarray:
        """The row order of an epoch: a permutation seeded by (seed, epoch) alone."""
        return np.random.default_rng([self.hp.seed, epoch]).permutation(len(self.rows))

    def normalize(self, position: DataPosition) -> DataPosition:
        """The end of an epoch is the start of the next."""
        epochs, step = divmod(position.step, self.steps_per_epoch)
        return DataPosition(position.epoch + epochs, step)

    def steps(self, start: DataPosition | None = None) -> Iterator[StepBatch]:
        """Every optimizer step from `start` (default: the beginning) to the end of the run."""
        position = self.normalize(start or DataPosition(0, 0))
        index = position.epoch * self.steps_per_epoch + position.step
        order_epoch, order = -1, np.empty(0, dtype=np.int64)
        while index < self.total_steps:
            if order_epoch != position.epoch:
                order_epoch, order = position.epoch, self.epoch_order(position.epoch)
            begin = position.step * self.global_batch
            chosen = [int(i) for i in order[begin : begin + self.global_batch]]
            yield self._step_batch(position, index, chosen)
            index += 1
            position = self.normalize(DataPosition(position.epoch, position.step + 1))

    def _step_batch(self, at: DataPosition, index: int, chosen: list[int]) -> StepBatch:
        mine = chosen[self.rank :: self.world_size]
        # The same count on every rank: the rank with the most rows decides.
        per_rank = math.ceil(len(chosen) / self.world_size)
        count = math.ceil(per_rank / self.hp.micro_batch_size)
        size = self.hp.micro_batch_size
        micro = [self._micro_batch(mine[k * size : (k + 1) * size]) for k in range(count)]
        return StepBatch(
            position=at,
            micro_batches=micro,
            step_label_tokens=sum(self.rows[i].num_label_tokens for i in chosen),
            global_step=index,
            next_position=self.normalize(DataPosition(at.epoch, at.step + 1)),
            num_tokens=sum(len(self.rows[i]) for i in mine),
            rows=mine,
        )

    def _micro_batch(self, indices: list[int]) -> dict[str, torch.Tensor]:
        rows = [self.rows[i] for i in indices] or [_empty_row(self._collate_args["pad_token_id"])]
        return collate(rows, **self._collate_args)


def _empty_row(pad_token_id: int) -> PackedRow:
    """One pad token without a label: a no-op micro-batch for a rank with no rows left."""
    return PackedRow([pad_token_id], [IGNORE_INDEX], [0], [1])


def _stats(
    examples: Sequence[TokenizedExample], rows: list[PackedRow], max_seq_len: int, steps: int
) -> dict[str, Any]:
    tokens = sum(len(e) for e in examples)
    capacity = len(rows) * max_seq_len
    return {
        "examples": len(examples),
        "rows": len(rows),
        "tokens": tokens,
        "label_tokens": sum(e.num_label_tokens for e in examples),
        "truncated": sum(1 for e in examples if e.truncated),
        # Pad share if every row were padded to max_seq_len (what packing leaves unused).
        "packing_waste": 1.0 - tokens / capacity,
        "steps_per_epoch": steps,
    }


# -- reading a snapshot --------------------------------------------------------------------


def load_snapshot_samples(
    location: str, *, store: ObjectStore | None, split: str = "train"
) -> list[Sample]:
    """The samples of one split of a snapshot: a local .jsonl file (train only), a local
    directory holding `<split>.jsonl`, or an `s3://bucket/prefix` (a .jsonl object or a prefix
    holding `<split>.jsonl`: a committed snapshot, the file checked against its manifest)."""
    if location.startswith("s3://"):
        if store is None:
            raise DatasetError(f"{location}: reading from S3 needs an object store")
        return _load_s3(location, store, split)
    path = Path(location)
    if path.is_file():
        if split != "train":
            raise DatasetError(f"{location}: a single file holds the train split only")
        return _read_jsonl(path, location)
    if path.is_dir():
        target = path / f"{split}.jsonl"
        if not target.is_file():
            raise DatasetError(f"{location}: no {split}.jsonl in the snapshot directory")
        return _read_jsonl(target, str(target))
    raise DatasetError(f"{location}: no such file or directory")


def _load_s3(location: str, store: ObjectStore, split: str) -> list[Sample]:
    loc = parse_uri(location)
    if loc.key.endswith(".jsonl"):
        if split != "train":
            raise DatasetError(f"{location}: a single file holds the train split only")
        key, expected = location, None  # one object is complete or absent, never partial
    else:
        prefix = loc.key.rstrip("/")
        key = f"s3://{loc.bucket}/{prefix}/{split}.jsonl"
        expected = _manifest_sha256(store, f"s3://{loc.bucket}/{prefix}", f"{split}.jsonl")
    with tempfile.TemporaryDirectory(prefix="tuneloop-snapshot-") as tmp:
        target = Path(tmp) / f"{split}.jsonl"
        try:
            stored = store.get_file(key, target)
        except ObjectNotFound:
            raise DatasetError(f"{key}: no such object") from None
        if expected is not None and stored.sha256 != expected:
            raise DatasetError(f"{key}: sha256 {stored.sha256} differs from the manifest's")
        return _read_jsonl(target, key)


def _manifest_sha256(store: ObjectStore, prefix: str, name: str) -> str:
    """The file's sha256 from the snapshot's manifest; a prefix without its commit marker is an
    unfinished upload and is never read."""
    try:
        manifest = store.read_manifest(prefix)
    except IncompleteDirectory:
        raise DatasetError(
            f"{prefix}: not a committed snapshot (no commit marker: upload unfinished or not a "
            "snapshot); give the s3:// URI of a .jsonl object to read one file as it is"
        ) from None
    for entry in manifest.files:
        if entry.path == name:
            return entry.sha256
    raise DatasetError(f"{prefix}: the snapshot's manifest lists no {name}")


def _read_jsonl(path: Path, source: str) -> list[Sample]:
    """Parse every line; all bad lines (up to a few) are named in one error."""
    samples: list[Sample] = []
    errors: list[str] = []
    with path.open("rb") as handle:
        for lineno, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                samples.append(Sample.from_json_bytes(line))
            except orjson.JSONDecodeError as exc:
                errors.append(f"{source}:{lineno}: not JSON ({exc})")
            except ValidationError as exc:
                errors.append(f"{source}:{lineno}: " + "; ".join(describe_errors(exc)[:3]))
            if len(errors) >= _MAX_REPORTED_ERRORS:
                break
    if errors:
        raise DatasetError("invalid samples:\n" + "\n".join(errors))
    if not samples:
        raise DatasetError(f"{source}: holds no samples")
    return samples


# -- tokenizing ----------------------------------------------------------------------------


def tokenize_samples(
    samples: Sequence[Sample], tokenizer: PreTrainedTokenizerBase, hp: Hyperparameters
) -> tuple[list[TokenizedExample], dict[str, Any]]:
    """Render every sample; those that cannot train are dropped and counted by reason.

    The report: samples, examples, truncated, dropped ({reason: count}) and the first few
    drop messages (they name the sample).
    """
    renderer = Renderer(tokenizer)
    examples: list[TokenizedExample] = []
    dropped: Counter[str] = Counter()
    messages: list[str] = []
    for sample in samples:
        try:
            examples.append(renderer.render(sample, loss_on=hp.loss_on, max_seq_len=hp.max_seq_len))
        except RenderError as exc:
            dropped[exc.reason] += 1
            if len(messages) < _MAX_REPORTED_ERRORS:
                messages.append(str(exc))
    if dropped:
        log.warning("dropped %d of %d samples: %s", sum(dropped.values()), len(samples), messages)
    report = {
        "samples": len(samples),
        "examples": len(examples),
        "truncated": sum(1 for e in examples if e.truncated),
        "dropped": dict(sorted(dropped.items())),
        "drop_messages": messages,
    }
    return examples, report

"""Sample packing: examples share rows of up to `max_seq_len` tokens without seeing each other.

Rows are filled by best-fit decreasing (deterministic: ties break on input order). The collator
gives every example `position_ids` from 0 and a block-diagonal causal mask, so a packed row
computes exactly what the examples compute one by one; labels are shifted per example upstream
(rendering.py), so the loss never asks one example to predict the next.

How transformers 5.24 (Llama) takes the mask, from `masking_utils.create_causal_mask`:

* A 4D mask is used as given (`_preprocess_mask_arguments` returns early). sdpa reads a boolean
  one (True = attend); eager *adds* the mask to the scores, so it needs the additive float form.
* With no mask, transformers infers packing from `position_ids` (a restart starts a new
  example) -- but only when no cache exists, and Llama creates a `DynamicCache` whenever
  `use_cache` is on (the config default). So that path needs `use_cache=False`; the explicit 4D
  mask is correct either way, which is why it is the default here.
* On a GPU with flash-attention the cheap path is "varlen": the micro-batch as ONE row of
  concatenated examples, no pads, no mask, `position_ids` restarting per example. transformers
  then calls `flash_attn_varlen_func` with the example boundaries (it requires batch size 1).

Pads form a causal block of their own at the end of a row: they attend to each other, so no
softmax row is empty (an empty one gives NaN, which would leak into the gradients).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F

from services.trainer.rendering import IGNORE_INDEX, TokenizedExample

# bool: 4D boolean mask (sdpa, the default attention); additive: 4D float 0 / -inf-ish (eager);
# varlen: rows flattened into one, no mask (flash-attention, or sdpa with use_cache=False).
MaskFormat = Literal["bool", "additive", "varlen"]


@dataclass(frozen=True)
class PackedRow:
    input_ids: list[int]
    labels: list[int]
    position_ids: list[int]
    # Token count of each example in the row, in order.
    lengths: list[int]
    sample_ids: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def num_label_tokens(self) -> int:
        return sum(1 for label in self.labels if label != IGNORE_INDEX)


def _row(examples: Sequence[TokenizedExample]) -> PackedRow:
    input_ids: list[int] = []
    labels: list[int] = []
    position_ids: list[int] = []
    for example in examples:
        input_ids += example.input_ids
        labels += example.labels
        position_ids += range(len(example))
    return PackedRow(
        input_ids, labels, position_ids, [len(e) for e in examples], [e.sample_id for e in examples]
    )


def pack(examples: Sequence[TokenizedExample], max_seq_len: int) -> list[PackedRow]:
    """Best-fit decreasing: longest example first, into the fullest row it still fits.

    Deterministic for the same input (sorting is stable, and among rows with equal room the
    oldest wins). Every example lands in exactly one row.
    """
    for example in examples:
        if len(example) > max_seq_len:
            raise ValueError(
                f"sample {example.sample_id}: {len(example)} tokens exceed max_seq_len={max_seq_len}"
            )
    order = sorted(range(len(examples)), key=lambda i: -len(examples[i]))
    bins: list[list[int]] = []
    room: list[tuple[int, int]] = []  # (free tokens, bin index), sorted: bisect finds best fit
    for i in order:
        size = len(examples[i])
        at = bisect.bisect_left(room, (size, -1))
        if at == len(room):
            bins.append([])
            free, b = max_seq_len, len(bins) - 1
        else:
            free, b = room.pop(at)
        bins[b].append(i)
        if free - size > 0:
            bisect.insort(room, (free - size, b))
    return [_row([examples[i] for i in members]) for members in bins]


def unpacked_rows(examples: Sequence[TokenizedExample]) -> list[PackedRow]:
    """One example per row (packing off)."""
    return [_row([example]) for example in examples]


def collate(
    rows: Sequence[PackedRow],
    *,
    pad_token_id: int,
    mask: MaskFormat = "bool",
    mask_dtype: torch.dtype = torch.float32,
) -> dict[str, torch.Tensor]:
    """Tensors for `model(**batch)` minus the labels (pop them: the loss is `token_loss`).

    `input_ids`, `labels` (-100 on pads), `position_ids` [B, T] padded to the longest row, and
    `attention_mask` [B, 1, T, T] in the form `mask` asks for; see the module docstring.
    `mask_dtype` is the additive mask's dtype (the model's compute dtype).
    """
    if not rows:
        raise ValueError("collate needs at least one row")
    if mask == "varlen":
        return _collate_varlen(rows)
    width = max(len(row) for row in rows)
    input_ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
    position_ids = torch.zeros((len(rows), width), dtype=torch.long)
    segments = torch.zeros((len(rows), width), dtype=torch.long)
    for b, row in enumerate(rows):
        n = len(row)
        input_ids[b, :n] = torch.tensor(row.input_ids)
        labels[b, :n] = torch.tensor(row.labels)
        # Pads get positions from 0 and a segment of their own: a block like any example.
        position_ids[b, :n] = torch.tensor(row.position_ids)
        position_ids[b, n:] = torch.arange(width - n)
        segments[b, :n] = torch.repeat_interleave(
            torch.arange(len(row.lengths)), torch.tensor(row.lengths)
        )
        segments[b, n:] = len(row.lengths)
    allowed = block_causal_mask(segments)
    return {
        "input_ids": input_ids,
        "labels": labels,
        "position_ids": position_ids,
        "attention_mask": allowed if mask == "bool" else additive_mask(allowed, mask_dtype),
    }


def block_causal_mask(segments: torch.Tensor) -> torch.Tensor:
    """[B, T] segment ids -> [B, 1, T, T] booleans: query q may see key k iff k <= q and both
    belong to the same segment."""
    width = segments.shape[1]
    causal = torch.ones((width, width), dtype=torch.bool).tril()
    same = segments[:, :, None] == segments[:, None, :]
    return (same & causal)[:, None]


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Booleans -> 0 where allowed, the dtype's most negative value elsewhere (eager adds it)."""
    blocked = torch.zeros(allowed.shape, dtype=dtype)
    return blocked.masked_fill(~allowed, torch.finfo(dtype).min)


def _collate_varlen(rows: Sequence[PackedRow]) -> dict[str, torch.Tensor]:
    """All rows as one unpadded row; example boundaries live in position_ids alone."""

    def flat(field: str) -> torch.Tensor:
        return torch.tensor([v for row in rows for v in getattr(row, field)]).unsqueeze(0)

    return {
        "input_ids": flat("input_ids"),
        "labels": flat("labels"),
        "position_ids": flat("position_ids"),
    }


def token_loss(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(SUM of per-token cross-entropy over labels != -100, number of such tokens).

    Labels are already shifted, so there is no model-side shift. The sum (not the mean) lets
    the loop divide by the token count of the whole optimizer step. Computed in fp32.
    """
    flat_labels = labels.reshape(-1).to(logits.device)
    keep = flat_labels != IGNORE_INDEX
    # Only labelled positions: the fp32 copy of the logits is then as small as it can be.
    picked = logits.reshape(-1, logits.shape[-1])[keep].float()
    total = F.cross_entropy(picked, flat_labels[keep], reduction="sum")
    return total, int(keep.sum())

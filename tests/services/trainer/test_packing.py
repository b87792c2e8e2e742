"""Sample packing: a packed batch computes exactly what its examples compute one by one."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import numpy as np
import pytest
import torch
from transformers import LlamaForCausalLM

from services.trainer.packing import PackedRow, collate, pack, token_loss, unpacked_rows
from services.trainer.rendering import IGNORE_INDEX, TokenizedExample

PAD = 2


def synthetic_example(rng: random.Random, length: int, name: str) -> TokenizedExample:
    """Random tokens; labels on a random tail (like an answer after a prompt), already shifted."""
    ids = [rng.randrange(3, 400) for _ in range(length)]
    answer_from = rng.randrange(0, length - 1)
    labels = [ids[i + 1] if i >= answer_from else IGNORE_INDEX for i in range(length - 1)]
    return TokenizedExample(ids, [*labels, IGNORE_INDEX], name)


def synthetic_examples(
    count: int, lengths: tuple[int, int], seed: int = 0
) -> list[TokenizedExample]:
    rng = random.Random(seed)
    return [synthetic_example(rng, rng.randint(*lengths), f"s{i}") for i in range(count)]


def forward_loss(
    model: LlamaForCausalLM, batch: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, int]:
    inputs = dict(batch)
    labels = inputs.pop("labels")
    logits = model(**inputs, use_cache=False).logits
    return token_loss(logits, labels)


def unpacked_reference(
    model: LlamaForCausalLM, examples: list[TokenizedExample]
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Token-weighted mean loss of the examples run one at a time, and its gradients."""
    model.zero_grad()
    total, count = torch.zeros(()), 0
    for example in examples:
        loss_sum, n = token_loss(
            model(input_ids=torch.tensor([example.input_ids])).logits,
            torch.tensor([example.labels]),
        )
        total, count = total + loss_sum, count + n
    loss = total / count
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize(
    ("mask", "attention"),
    [("bool", "sdpa"), ("additive", "sdpa"), ("additive", "eager"), ("varlen", "sdpa")],
)
def test_packed_loss_and_gradients_equal_unpacked(
    tiny_model: LlamaForCausalLM, mask: Any, attention: str
) -> None:
    tiny_model.config._attn_implementation = attention
    examples = synthetic_examples(9, (4, 60))
    rows = pack(examples, max_seq_len=96)
    assert any(len(row.lengths) > 1 for row in rows)  # really packed
    assert len({len(row) for row in rows}) > 1  # and rows padded to the longest

    reference, reference_grads = unpacked_reference(tiny_model, examples)
    tiny_model.zero_grad()
    loss_sum, count = forward_loss(tiny_model, collate(rows, pad_token_id=PAD, mask=mask))
    loss = loss_sum / count
    loss.backward()

    assert count == sum(e.num_label_tokens for e in examples)
    torch.testing.assert_close(loss.detach(), reference, rtol=1e-5, atol=0)
    for name, param in tiny_model.named_parameters():
        torch.testing.assert_close(param.grad, reference_grads[name], rtol=1e-4, atol=1e-6)


def test_no_attention_across_examples(tiny_model: LlamaForCausalLM) -> None:
    rng = random.Random(1)
    a, b = synthetic_example(rng, 20, "a"), synthetic_example(rng, 15, "b")
    changed_a = TokenizedExample([(t + 7) % 400 + 3 for t in a.input_ids], a.labels, "a")

    def logits(first: TokenizedExample) -> torch.Tensor:
        batch = collate([pack([first, b], 64)[0]], pad_token_id=PAD)
        batch.pop("labels")
        with torch.no_grad():
            return tiny_model(**batch).logits[0]

    before, after = logits(a), logits(changed_a)

    assert not torch.allclose(before[:20], after[:20])  # A itself did change
    torch.testing.assert_close(before[20:], after[20:], rtol=0, atol=1e-6)


def test_collate_layout() -> None:
    row = PackedRow([5, 6, 7, 8, 9], [6, IGNORE_INDEX, 8, 9, IGNORE_INDEX], [0, 1, 0, 1, 2], [2, 3])
    short = PackedRow([4, 5], [5, IGNORE_INDEX], [0, 1], [2])

    batch = collate([row, short], pad_token_id=PAD)

    assert batch["input_ids"].tolist() == [[5, 6, 7, 8, 9], [4, 5, PAD, PAD, PAD]]
    assert batch["labels"][1].tolist() == [
        5,
        IGNORE_INDEX,
        IGNORE_INDEX,
        IGNORE_INDEX,
        IGNORE_INDEX,
    ]
    assert batch["position_ids"].tolist() == [[0, 1, 0, 1, 2], [0, 1, 0, 1, 2]]
    assert batch["attention_mask"].shape == (2, 1, 5, 5)
    expected = [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [0, 0, 1, 0, 0],
        [0, 0, 1, 1, 0],
        [0, 0, 1, 1, 1],
    ]
    assert batch["attention_mask"][0, 0].int().tolist() == expected
    # The second row's pads are a block of their own: every query sees at least itself.
    assert batch["attention_mask"][1, 0].int().tolist() == expected
    additive = collate([row], pad_token_id=PAD, mask="additive")["attention_mask"]
    assert additive.dtype == torch.float32
    assert additive[0, 0, 1].tolist() == [0, 0, *[torch.finfo(torch.float32).min] * 3]


def test_varlen_collate_is_one_unpadded_row() -> None:
    rows = pack(synthetic_examples(5, (3, 9)), 12)

    batch = collate(rows, pad_token_id=PAD, mask="varlen")

    tokens = sum(len(row) for row in rows)
    assert batch["input_ids"].shape == (1, tokens)
    assert "attention_mask" not in batch
    assert batch["position_ids"][0].tolist() == [p for row in rows for p in row.position_ids]


def test_token_loss_sums_labelled_tokens_only() -> None:
    logits = torch.randn(2, 4, 7, requires_grad=True)
    labels = torch.tensor([[1, IGNORE_INDEX, 3, IGNORE_INDEX], [IGNORE_INDEX, 6, 0, IGNORE_INDEX]])

    total, count = token_loss(logits, labels)

    picked = torch.stack([logits[0, 0], logits[0, 2], logits[1, 1], logits[1, 2]])
    expected = torch.nn.functional.cross_entropy(
        picked, torch.tensor([1, 3, 6, 0]), reduction="sum"
    )
    assert count == 4
    torch.testing.assert_close(total, expected)
    empty, none = token_loss(logits, torch.full((2, 4), IGNORE_INDEX))
    empty.backward()  # a micro-batch without labels still has a graph (DDP needs its backward)
    assert none == 0
    assert empty.item() == 0.0


def lognormal_examples(count: int, seed: int = 0) -> list[TokenizedExample]:
    """Token lengths like real chat traffic: median ~250, a long tail past 2000."""
    lengths = np.random.default_rng(seed).lognormal(mean=5.5, sigma=0.8, size=count)
    lengths = np.clip(lengths.astype(int), 16, 2048)
    return [
        TokenizedExample([3] * int(n), [IGNORE_INDEX] * int(n), f"s{i}")
        for i, n in enumerate(lengths)
    ]


def test_packing_waste_is_small_on_a_realistic_length_mix() -> None:
    examples = lognormal_examples(3000)
    rows = pack(examples, max_seq_len=2048)

    tokens = sum(len(e) for e in examples)
    waste = 1 - tokens / (len(rows) * 2048)
    assert waste <= 0.03, f"packing wastes {waste:.2%}"
    assert all(len(row) <= 2048 for row in rows)


def test_pack_is_deterministic_and_places_every_example_once() -> None:
    examples = lognormal_examples(500, seed=3)

    rows = pack(examples, max_seq_len=1024 * 2)

    assert rows == pack(examples, max_seq_len=2048)
    placed = Counter(sample_id for row in rows for sample_id in row.sample_ids)
    assert placed == Counter(e.sample_id for e in examples)
    for row in rows:
        assert sum(row.lengths) == len(row)
        assert row.position_ids == [p for n in row.lengths for p in range(n)]


def test_unpacked_rows_hold_one_example_each() -> None:
    examples = synthetic_examples(4, (3, 9))

    rows = unpacked_rows(examples)

    assert [row.sample_ids for row in rows] == [[e.sample_id] for e in examples]
    assert [row.input_ids for row in rows] == [e.input_ids for e in examples]


def test_example_longer_than_a_row_is_refused() -> None:
    example = TokenizedExample([3] * 40, [IGNORE_INDEX] * 40, "too-long")
    with pytest.raises(ValueError, match="sample too-long: 40 tokens exceed max_seq_len=32"):
        pack([example], 32)

"""The data path: snapshots in (local and real S3), tokenized examples, deterministic steps that
resume exactly and shard across ranks without changing what a step contains."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import torch

from services.trainer.config import Hyperparameters
from services.trainer.data import (
    DataPosition,
    DatasetError,
    StepBatch,
    TrainingData,
    load_snapshot_samples,
    tokenize_samples,
)
from services.trainer.packing import token_loss
from services.trainer.rendering import IGNORE_INDEX, TokenizedExample
from shared.chat import Sample
from shared.storage import ObjectStore

PAD = 2


def chat(i: int, *, answer_words: int = 3, question_words: int = 1) -> Sample:
    question = " ".join(["question"] * question_words)
    return Sample.model_validate(
        {
            "tenant": "acme",
            "source": "upload",
            "source_ref": f"file-1:{i}",
            "created_at": datetime(2026, 1, 1, tzinfo=UTC),
            "messages": [
                {"role": "user", "content": f"{question} number {i}?"},
                {"role": "assistant", "content": " ".join(["answer"] * answer_words)},
            ],
        }
    )


def write_jsonl(path: Path, samples: list[Sample]) -> Path:
    path.write_bytes(b"".join(s.to_json_bytes() + b"\n" for s in samples))
    return path


def examples(count: int, seed: int = 0) -> list[TokenizedExample]:
    rng = random.Random(seed)
    out = []
    for i in range(count):
        n = rng.randint(4, 30)
        labels = [rng.choice([IGNORE_INDEX, 5]) for _ in range(n - 1)]
        out.append(TokenizedExample([3 + i % 50] * n, [*labels, IGNORE_INDEX], f"s{i}"))
    return out


def hp(**overrides: Any) -> Hyperparameters:
    base = {"micro_batch_size": 2, "gradient_accumulation_steps": 2, "max_seq_len": 64, "epochs": 2}
    return Hyperparameters(**{**base, "seed": 7, **overrides})


def fingerprint(step: StepBatch) -> tuple[Any, ...]:
    """What a step feeds the model, comparable with ==."""
    tensors = tuple(
        (key, tuple(map(tuple, value.flatten(1).tolist())))
        for micro in step.micro_batches
        for key, value in sorted(micro.items())
    )
    return step.position, step.global_step, step.step_label_tokens, tensors


# -- steps -----------------------------------------------------------------------------------


def test_every_row_once_per_epoch_and_the_last_step_is_kept() -> None:
    data = TrainingData(examples(45), hp(packing=False), pad_token_id=PAD)

    assert data.steps_per_epoch == 12  # 45 rows / 4 per step, the last step holds 1
    assert data.total_steps == 24
    steps = list(data.steps())
    assert [s.global_step for s in steps] == list(range(24))
    for epoch in (0, 1):
        seen = [row for s in steps if s.position.epoch == epoch for row in s.rows]
        assert sorted(seen) == list(range(45))
    assert len(steps[11].micro_batches) == 1
    assert steps[11].next_position == DataPosition(1, 0)
    # Each epoch has its own order.
    assert [s.rows for s in steps[:12]] != [s.rows for s in steps[12:]]


def test_step_label_tokens_count_the_whole_step() -> None:
    data = TrainingData(examples(30), hp(), pad_token_id=PAD)

    for step in data.steps():
        labelled = sum(int((m["labels"] != IGNORE_INDEX).sum()) for m in step.micro_batches)
        assert step.step_label_tokens == labelled
        assert step.num_tokens == sum(len(data.rows[i]) for i in step.rows)


def test_order_is_a_function_of_seed_and_epoch() -> None:
    one = [fingerprint(s) for s in TrainingData(examples(40), hp(), pad_token_id=PAD).steps()]
    two = [fingerprint(s) for s in TrainingData(examples(40), hp(), pad_token_id=PAD).steps()]
    other = TrainingData(examples(40), hp(seed=8), pad_token_id=PAD)

    assert one == two
    assert one != [fingerprint(s) for s in other.steps()]


@pytest.mark.parametrize("resume_at", [DataPosition(0, 2), DataPosition(1, 1), DataPosition(0, 15)])
def test_resume_yields_the_same_later_batches(resume_at: DataPosition) -> None:
    data = TrainingData(examples(60), hp(packing=False), pad_token_id=PAD)
    assert data.steps_per_epoch == 15  # (0, 15): the end of epoch 0 is the start of epoch 1
    uninterrupted = [fingerprint(s) for s in data.steps()]

    resumed = [fingerprint(s) for s in data.steps(resume_at)]

    start = data.normalize(resume_at)
    skipped = start.epoch * data.steps_per_epoch + start.step
    assert resumed == uninterrupted[skipped:]
    assert 0 < len(resumed) < len(uninterrupted)


def test_max_steps_ends_the_run_early() -> None:
    data = TrainingData(examples(60), hp(max_steps=5), pad_token_id=PAD)

    assert data.total_steps == 5
    steps = list(data.steps())
    assert len(steps) == 5
    assert list(data.steps(steps[-1].next_position)) == []


def test_two_ranks_see_exactly_what_one_process_sees() -> None:
    # The same global batch (8 rows): 1 process x 4 accumulation, or 2 ranks x 2.
    single = TrainingData(
        examples(37), hp(gradient_accumulation_steps=4, packing=False), pad_token_id=PAD
    )
    ranks = [
        TrainingData(examples(37), hp(packing=False), pad_token_id=PAD, rank=r, world_size=2)
        for r in (0, 1)
    ]

    steps = list(zip(single.steps(), *(r.steps() for r in ranks), strict=True))
    assert len(steps) == single.total_steps == 10
    for one, rank0, rank1 in steps:
        assert sorted(rank0.rows + rank1.rows) == sorted(one.rows)
        assert not set(rank0.rows) & set(rank1.rows)
        assert rank0.step_label_tokens == rank1.step_label_tokens == one.step_label_tokens
        assert len(rank0.micro_batches) == len(rank1.micro_batches)


def test_a_rank_without_rows_left_gets_a_micro_batch_without_labels() -> None:
    # 37 rows, 8 per step: the last step of an epoch holds 5 rows, so rank 1 gets 2 of them
    # (one micro-batch) while rank 0 gets 3 (two micro-batches).
    rank1 = TrainingData(examples(37), hp(packing=False), pad_token_id=PAD, rank=1, world_size=2)

    last = list(rank1.steps())[4]

    assert len(last.rows) == 2
    assert len(last.micro_batches) == 2
    filler = last.micro_batches[1]
    assert filler["input_ids"].tolist() == [[PAD]]
    assert (filler["labels"] == IGNORE_INDEX).all()


def test_packing_stats() -> None:
    data = TrainingData(examples(100), hp(max_seq_len=128), pad_token_id=PAD)

    stats = data.stats
    assert stats["examples"] == 100
    assert stats["rows"] == len(data.rows) < 100
    assert stats["tokens"] == sum(len(r) for r in data.rows)
    assert stats["label_tokens"] == sum(r.num_label_tokens for r in data.rows)
    assert 0 <= stats["packing_waste"] < 0.1


def test_training_data_refuses_no_examples() -> None:
    with pytest.raises(ValueError, match="no training examples"):
        TrainingData([], hp(), pad_token_id=PAD)


def test_micro_batches_carry_the_requested_mask() -> None:
    bool_mask = TrainingData(examples(8), hp(), pad_token_id=PAD)
    varlen = TrainingData(examples(8), hp(), pad_token_id=PAD, mask="varlen")

    assert next(bool_mask.steps()).micro_batches[0]["attention_mask"].dtype == torch.bool
    assert "attention_mask" not in next(varlen.steps()).micro_batches[0]


# -- tokenizing ------------------------------------------------------------------------------


def test_tokenize_samples_drops_and_counts(tiny_tokenizer: Any) -> None:
    no_answer = chat(1).model_copy(update={"messages": chat(1).messages[:1]})
    long_prompt = chat(2, question_words=60)
    long_answer = chat(3, answer_words=60)
    samples = [chat(0), no_answer, long_prompt, long_answer]

    found, report = tokenize_samples(samples, tiny_tokenizer, hp(max_seq_len=40))

    assert [e.sample_id for e in found] == [samples[0].id, long_answer.id]
    assert [len(e) for e in found][1] == 40
    assert report["samples"] == 4
    assert report["examples"] == 2
    assert report["truncated"] == 1  # the long answer: cut, still trained on
    assert report["dropped"] == {"no_assistant": 1, "too_long": 1}
    assert any(no_answer.id in message for message in report["drop_messages"])


# -- snapshots -------------------------------------------------------------------------------


def snapshot_dir(root: Path) -> Path:
    root.mkdir()
    write_jsonl(root / "train.jsonl", [chat(i) for i in range(3)])
    write_jsonl(root / "eval.jsonl", [chat(10)])
    return root


def test_load_local_dir_and_file(tmp_path: Path) -> None:
    root = snapshot_dir(tmp_path / "snap")

    train = load_snapshot_samples(str(root), store=None)
    evaluation = load_snapshot_samples(str(root), store=None, split="eval")
    single = load_snapshot_samples(str(root / "train.jsonl"), store=None)

    assert [s.id for s in train] == [chat(i).id for i in range(3)]
    assert [s.id for s in evaluation] == [chat(10).id]
    assert single == train


def test_bad_lines_are_named_with_file_and_line(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "train.jsonl", [chat(0)])
    good = path.read_bytes()
    broken = chat(1).to_json_bytes().replace(b'"role":"user"', b'"role":"robot"')
    path.write_bytes(good + b"\n" + b"{not json\n" + broken + b"\n")

    with pytest.raises(DatasetError) as caught:
        load_snapshot_samples(str(path), store=None)

    message = str(caught.value)
    assert f"{path}:3: not JSON" in message
    assert f"{path}:4: messages[0].role" in message


@pytest.mark.parametrize(
    ("location", "split", "error"),
    [
        ("missing", "train", "no such file or directory"),
        ("snap", "test", "no test.jsonl in the snapshot directory"),
        ("snap/train.jsonl", "eval", "a single file holds the train split only"),
    ],
)
def test_missing_split_or_location(tmp_path: Path, location: str, split: str, error: str) -> None:
    snapshot_dir(tmp_path / "snap")
    with pytest.raises(DatasetError, match=error):
        load_snapshot_samples(str(tmp_path / location), store=None, split=split)


def test_load_committed_snapshot_from_s3(object_store: ObjectStore, tmp_path: Path) -> None:
    object_store.put_dir(snapshot_dir(tmp_path / "snap"), "datasets/d1/v1")
    uri = object_store.uri("datasets/d1/v1")

    train = load_snapshot_samples(uri, store=object_store)
    evaluation = load_snapshot_samples(uri + "/", store=object_store, split="eval")

    assert [s.id for s in train] == [chat(i).id for i in range(3)]
    assert [s.id for s in evaluation] == [chat(10).id]


def test_s3_snapshot_must_be_committed_and_intact(
    object_store: ObjectStore, tmp_path: Path
) -> None:
    root = snapshot_dir(tmp_path / "snap")
    object_store.put_file("datasets/partial/train.jsonl", root / "train.jsonl")
    with pytest.raises(DatasetError, match="not a committed snapshot"):
        load_snapshot_samples(object_store.uri("datasets/partial"), store=object_store)

    object_store.put_dir(root, "datasets/changed")
    object_store.put_bytes("datasets/changed/train.jsonl", chat(5).to_json_bytes())
    with pytest.raises(DatasetError, match="differs from the manifest"):
        load_snapshot_samples(object_store.uri("datasets/changed"), store=object_store)


def test_load_single_jsonl_object_from_s3(object_store: ObjectStore, tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "train.jsonl", [chat(0), chat(1)])
    path.write_bytes(path.read_bytes() + b"[1, 2]\n")
    object_store.put_file("uploads/train.jsonl", path)
    uri = object_store.uri("uploads/train.jsonl")

    with pytest.raises(DatasetError, match=f"{uri}:3: "):
        load_snapshot_samples(uri, store=object_store)
    with pytest.raises(DatasetError, match="no such object"):
        load_snapshot_samples(object_store.uri("uploads/none.jsonl"), store=object_store)


def test_step_loss_over_ranks_equals_the_unpacked_loss(
    tiny_tokenizer: Any, tiny_model: Any
) -> None:
    """The whole path: rendered samples -> packed steps on 2 ranks -> the step's loss (summed
    over ranks and micro-batches, divided by step_label_tokens) equals the token-weighted loss
    of the same samples run one by one."""
    samples = [chat(i, answer_words=1 + i % 5, question_words=1 + i % 3) for i in range(14)]
    found, _ = tokenize_samples(samples, tiny_tokenizer, hp(max_seq_len=64))
    by_id = {e.sample_id: e for e in found}
    ranks = [
        TrainingData(found, hp(max_seq_len=64), pad_token_id=PAD, rank=r, world_size=2)
        for r in (0, 1)
    ]
    step0, step1 = (next(r.steps()) for r in ranks)

    total = torch.zeros(())
    with torch.no_grad():
        for step in (step0, step1):
            for micro in step.micro_batches:
                inputs = dict(micro)
                labels = inputs.pop("labels")
                total += token_loss(tiny_model(**inputs, use_cache=False).logits, labels)[0]
        step_ids = [
            s
            for r, step in zip(ranks, (step0, step1), strict=True)
            for i in step.rows
            for s in r.rows[i].sample_ids
        ]
        reference, count = torch.zeros(()), 0
        for sample_id in step_ids:
            example = by_id[sample_id]
            loss_sum, n = token_loss(
                tiny_model(input_ids=torch.tensor([example.input_ids])).logits,
                torch.tensor([example.labels]),
            )
            reference, count = reference + loss_sum, count + n

    assert len(step_ids) > 4  # rows really hold several samples
    assert count == step0.step_label_tokens
    torch.testing.assert_close(
        total / step0.step_label_tokens, reference / count, rtol=1e-5, atol=0
    )

"""Snapshots in real S3: content-hash versions, immutability, read-back, stats and export."""

from __future__ import annotations

import random
from pathlib import Path

import orjson
import pytest

from services.ingest.datasets.cleaning import (
    TokenCounter,
    TokenizerLoadError,
    clean_and_split,
    load_tokenizer,
)
from services.ingest.datasets.snapshots import (
    SnapshotError,
    compute_stats,
    export_split_to_file,
    openai_line,
    read_snapshot,
    write_snapshot,
)
from services.ingest.datasets.spec import DatasetSpec
from shared.chat import ImagePart, Message, TextPart, ToolCall, ToolDef
from shared.storage import ObjectStore
from tests.services.ingest.datasets import make_sample

SPEC = DatasetSpec.model_validate(
    {"name": "support", "source": {}, "split": {"eval_size": 4, "seed": 3}}
)


def _samples() -> list:
    samples = [make_sample(f"question {i} about billing", f"answer {i}", n=i) for i in range(20)]
    samples.append(make_sample("contact me: jo@example.com", "noted", n=30))
    samples.append(
        make_sample(
            "weather",
            messages=[
                Message(role="user", content="Weather in Paris?"),
                Message(
                    role="assistant",
                    tool_calls=[ToolCall(id="c1", name="weather", arguments={"city": "Paris"})],
                ),
                Message(role="tool", tool_call_id="c1", content="sunny"),
                Message(role="assistant", content="It is sunny."),
            ],
            tools=[ToolDef(name="weather", parameters={"type": "object"})],
            n=31,
        )
    )
    samples.append(
        make_sample(
            "img",
            messages=[
                Message(
                    role="user",
                    content=[
                        TextPart(text="What is in this picture?"),
                        ImagePart(url="https://example.com/cat.png"),
                    ],
                ),
                Message(role="assistant", content="A cat."),
            ],
            n=32,
        )
    )
    return samples


def _build(samples: list, store: ObjectStore, tokenizer=None):
    train, eval_, report = clean_and_split(samples, SPEC.cleaning, SPEC.split, tokenizer=tokenizer)
    return write_snapshot(
        store,
        tenant="acme",
        train=train,
        eval=eval_,
        report=report,
        spec=SPEC,
        lineage={"file_ids": []},
        tokenizer=tokenizer,
    )


def test_a_snapshot_round_trips_and_rebuilds_to_the_same_version(
    object_store: ObjectStore, tiny_tokenizer
) -> None:
    samples = _samples()
    snapshot = _build(samples, object_store, tiny_tokenizer)
    assert snapshot.created
    assert snapshot.uri == object_store.uri(f"tenants/acme/datasets/{snapshot.version}/")
    assert (snapshot.train_count, snapshot.eval_count) == (19, 4)
    train, eval_, meta = read_snapshot(object_store, snapshot.uri)
    assert [s.id for s in train] == sorted(meta["lineage"]["train_ids"])
    assert len(eval_) == 4
    assert meta["report"]["input_count"] - meta["report"]["removed"] == 23
    assert meta["spec"]["name"] == "support"
    assert "jo@example.com" not in str([s.to_json_bytes() for s in train + eval_])

    shuffled = samples[:]
    random.Random(5).shuffle(shuffled)
    again = _build(shuffled, object_store, tiny_tokenizer)
    assert again.version == snapshot.version
    assert not again.created
    assert again.stats == snapshot.stats


def test_a_split_exports_to_a_file_line_by_line(object_store: ObjectStore, tmp_path: Path) -> None:
    snapshot = _build(_samples(), object_store)
    train, eval_, _ = read_snapshot(object_store, snapshot.uri)
    for split, samples in (("train", train), ("eval", eval_)):
        dest = tmp_path / f"{split}.jsonl"
        assert export_split_to_file(object_store, snapshot.uri, split, dest) == len(samples)
        assert dest.read_bytes() == b"".join(openai_line(s) for s in samples)
    # A split file that no longer matches the manifest is refused, not exported.
    object_store.put_bytes(f"{snapshot.uri}train.jsonl", b"{}\n")
    with pytest.raises(SnapshotError, match="sha256"):
        export_split_to_file(object_store, snapshot.uri, "train", tmp_path / "bad.jsonl")


def test_a_committed_version_is_never_rewritten(object_store: ObjectStore) -> None:
    snapshot = _build(_samples(), object_store)
    prefix = f"tenants/acme/datasets/{snapshot.version}"
    before = object_store.get_bytes(f"{prefix}/dataset.json")
    again = _build(_samples(), object_store)
    assert object_store.get_bytes(f"{prefix}/dataset.json") == before
    assert again.manifest == snapshot.manifest
    different = _build(_samples()[:-1], object_store)
    assert different.version != snapshot.version


def test_a_corrupt_line_names_file_and_line(object_store: ObjectStore, tmp_path: Path) -> None:
    root = tmp_path / "snap"
    root.mkdir()
    good = make_sample("q", "a").to_json_bytes()
    (root / "train.jsonl").write_bytes(good + b"\n" + b'{"tenant": "acme"}\n')
    (root / "eval.jsonl").write_bytes(b"")
    (root / "dataset.json").write_bytes(b"{}")
    object_store.put_dir(root, "tenants/acme/datasets/broken")
    with pytest.raises(SnapshotError, match=r"train\.jsonl:2: "):
        read_snapshot(object_store, object_store.uri("tenants/acme/datasets/broken/"))


def test_stats_count_tokens_turns_tools_and_modalities(tiny_tokenizer) -> None:
    samples = _samples()
    counter = TokenCounter(tiny_tokenizer)
    stats = compute_stats(samples[:-3], samples[-3:], counter)
    assert stats["tokenizer"] == counter.name
    train, eval_ = stats["train"], stats["eval"]
    assert train["count"] == 20
    assert eval_["tool_use"] == {
        "samples_with_tools": 1,
        "samples_with_tool_calls": 1,
        "tool_calls": 1,
    }
    assert eval_["modalities"] == {"image": 1, "text": 3}
    assert eval_["assistant_turns"]["max"] == 2
    prompt = train["tokens"]["prompt"]
    assert 0 < prompt["p50"] <= prompt["p90"] <= prompt["p99"] <= prompt["max"]
    first = counter.prompt_completion(samples[0])
    assert first[1] == counter.count("assistant\nanswer 0") + counter.per_message
    # The answers' own tokens, without the template around the turn that `completion` counts.
    answers = [counter.count(s.messages[-1].text()) for s in samples[:-3]]
    assert train["tokens"]["answer"]["max"] == max(answers)
    assert train["tokens"]["answer"]["total"] == sum(answers)
    assert train["tokens"]["answer"]["max"] < train["tokens"]["completion"]["max"]


def test_token_percentiles_of_a_big_split_come_from_a_fixed_subsample() -> None:
    samples = _samples()
    counter = TokenCounter()
    whole = compute_stats(samples, [], counter)["train"]["tokens"]
    assert whole["counted_samples"] == len(samples)
    assert whole["estimated"] is False
    part = compute_stats(samples, [], counter, token_sample=10)["train"]["tokens"]
    again = compute_stats(list(reversed(samples)), [], counter, token_sample=10)["train"]["tokens"]
    assert part["counted_samples"] == 10
    assert part["estimated"] is True
    assert part == again  # the subsample does not depend on order
    assert part["prompt"]["max"] <= whole["prompt"]["max"]


def test_openai_export_lines_are_fine_tuning_records() -> None:
    lines = [openai_line(s) for s in _samples()[-2:]]
    tool_record = orjson.loads(lines[0])
    assert tool_record["tools"][0]["function"]["name"] == "weather"
    assert (
        tool_record["messages"][1]["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'
    )
    image_record = orjson.loads(lines[1])
    assert image_record["messages"][0]["content"][1]["type"] == "image_url"
    assert all(line.endswith(b"\n") for line in lines)


def test_the_tokenizer_loads_from_a_directory_or_an_s3_prefix(
    object_store: ObjectStore, tiny_tokenizer, tmp_path: Path
) -> None:
    tiny_tokenizer.save_pretrained(tmp_path / "model")
    (tmp_path / "model" / "model.safetensors").write_bytes(b"weights are not fetched")
    object_store.put_dir(tmp_path / "model", "models/tiny")
    text = "The quick brown fox"
    expected = tiny_tokenizer(text)["input_ids"]
    local = load_tokenizer(str(tmp_path / "model"))
    remote = load_tokenizer(object_store.uri("models/tiny"), object_store)
    assert local(text)["input_ids"] == remote(text)["input_ids"] == expected
    assert load_tokenizer(None) is None
    with pytest.raises(TokenizerLoadError, match="base_model"):
        load_tokenizer(str(tmp_path / "missing"))
    with pytest.raises(TokenizerLoadError, match="no tokenizer files"):
        load_tokenizer(object_store.uri("models/none"), object_store)

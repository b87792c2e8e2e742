"""The fixed eval subset: seeded, stable under input order, read from a real snapshot in S3."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from services.evaluator import subset
from shared.storage import ObjectStore
from tests.services.evaluator.samples import reference, ticket, with_tool_call


def test_the_pick_depends_on_the_seed_and_ids_only_not_the_input_order() -> None:
    samples = [ticket(n) for n in range(40)]
    shuffled = samples[:]
    random.Random(7).shuffle(shuffled)
    first = [s.id for s in subset.pick(samples, size=16, seed="v1")]
    assert [s.id for s in subset.pick(shuffled, size=16, seed="v1")] == first
    assert len(first) == len(set(first)) == 16
    # Another dataset version picks other items; a larger size keeps the smaller's items first.
    assert [s.id for s in subset.pick(samples, size=16, seed="v2")] != first
    assert [s.id for s in subset.pick(samples, size=24, seed="v1")][:16] == first


def test_samples_without_a_final_assistant_turn_are_left_out() -> None:
    samples = [ticket(n, answered=n % 2 == 0) for n in range(10)]
    picked = subset.pick(samples, size=16, seed="v1")
    assert len(picked) == 5
    assert all(s.completion() is not None for s in picked)


def test_an_item_is_the_prompt_up_to_the_final_turn_and_that_turn_is_the_reference() -> None:
    item = subset.item_of(0, ticket(4))
    assert [m["role"] for m in item.messages] == ["system", "user"]
    assert item.reference.text == reference(4)
    assert item.tools == []
    assert subset.MIN_TOKENS <= item.max_tokens <= subset.MAX_TOKENS
    # Headroom: an answer twice the reference's estimated length still fits.
    assert item.max_tokens >= 2 * len(reference(4)) / subset.CHARS_PER_TOKEN

    tools = subset.item_of(1, with_tool_call(3))
    assert tools.reference.tool_calls == (("weather", '{"city": 3}'),)
    assert tools.reference.text == ""
    assert [tool["function"]["name"] for tool in tools.tools] == ["weather"]
    assert [m["role"] for m in tools.messages] == ["user"]


def test_max_tokens_is_capped_for_a_very_long_reference() -> None:
    long = subset.reference_of(ticket(1)).__class__(text="x" * 100_000)
    assert subset.max_tokens_for(long) == subset.MAX_TOKENS


def _snapshot(store: ObjectStore, tmp_path: Path, lines: bytes) -> str:
    (tmp_path / "eval.jsonl").write_bytes(lines)
    (tmp_path / "train.jsonl").write_bytes(b"")
    store.put_dir(tmp_path, "tenants/acme/datasets/abc")
    return store.uri("tenants/acme/datasets/abc/")


def test_the_subset_is_read_from_a_committed_snapshot(
    object_store: ObjectStore, tmp_path: Path
) -> None:
    body = b"".join(ticket(n).to_json_bytes() + b"\n" for n in range(30))
    uri = _snapshot(object_store, tmp_path, body)
    items = subset.build_subset(object_store, dataset_uri=uri, dataset_version="abc", eval_items=4)
    assert len(items) == subset.MIN_ITEMS  # never fewer than 16 when the split has them
    again = subset.build_subset(object_store, dataset_uri=uri, dataset_version="abc", eval_items=4)
    assert [i.sample_id for i in again] == [i.sample_id for i in items]
    assert [i.position for i in items] == list(range(16))


def test_a_bad_line_or_a_missing_snapshot_is_a_subset_error_naming_it(
    object_store: ObjectStore, tmp_path: Path
) -> None:
    uri = _snapshot(object_store, tmp_path, ticket(1).to_json_bytes() + b'\n{"tenant": 1}\n')
    with pytest.raises(subset.SubsetError, match=r"eval\.jsonl line 2"):
        subset.build_subset(object_store, dataset_uri=uri, dataset_version="abc", eval_items=16)
    with pytest.raises(subset.SubsetError, match="no committed snapshot"):
        subset.build_subset(
            object_store,
            dataset_uri=object_store.uri("tenants/acme/datasets/nothing/"),
            dataset_version="x",
            eval_items=16,
        )

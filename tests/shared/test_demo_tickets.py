"""The demo task: seeded, varied tickets whose answers can be read off the text, disjoint train
and held-out splits, prompt sizes a 135M model trains on quickly, and the per-field grader."""

from __future__ import annotations

import json
import statistics
from collections import Counter
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from shared.dev.demo import tickets
from shared.dev.demo.tickets import (
    ANSWER_SCHEMA,
    FIELDS,
    HELDOUT_SIZE,
    SYSTEM_PROMPT,
    TEACHER_MODEL,
    TRAIN_SIZE,
    Ticket,
    TicketFields,
    answer_json,
    field_accuracy,
    field_scores,
    generate,
    generate_all,
    parse_answer,
)


@pytest.fixture(scope="module")
def splits() -> tuple[list[Ticket], list[Ticket]]:
    return generate_all()


def test_the_same_seed_gives_the_same_tickets_and_another_seed_others() -> None:
    assert generate("train") == generate("train")
    assert generate("heldout", seed=1) == generate("heldout", seed=1)
    assert {t.text for t in generate("train", seed=1)} != {t.text for t in generate("train")}


def test_sizes_and_no_held_out_ticket_is_a_training_one(
    splits: tuple[list[Ticket], list[Ticket]],
) -> None:
    train, heldout = splits
    assert len(train) == TRAIN_SIZE == 400
    assert len(heldout) == HELDOUT_SIZE >= 100
    train_texts = {t.text for t in train}
    assert len(train_texts) == len(train)
    assert not train_texts & {t.text for t in heldout}
    assert not {t.id for t in train} & {t.id for t in heldout}


def test_every_value_of_every_field_occurs_in_training(
    splits: tuple[list[Ticket], list[Ticket]],
) -> None:
    answers = [t.answer for t in splits[0]]
    for name in ("category", "priority", "sentiment"):
        values = TicketFields.model_fields[name].annotation.__args__  # type: ignore[union-attr]
        seen = Counter(getattr(a, name) for a in answers)
        assert set(seen) == set(values), name
        assert min(seen.values()) >= 40, seen  # enough of each to learn it
    assert set(Counter(a.refund_requested for a in answers)) == {True, False}
    assert any(a.order_id is None for a in answers)
    assert len({a.product for a in answers}) == len(tickets.PRODUCTS)
    assert len({a.customer_name for a in answers}) > 200


def test_the_answer_can_be_read_off_the_ticket(
    splits: tuple[list[Ticket], list[Ticket]],
) -> None:
    for ticket in splits[0] + splits[1]:
        answer = ticket.answer
        assert answer.product in ticket.text
        assert f"From: {answer.customer_name}\n" in ticket.text
        assert answer.order_id is None or answer.order_id in ticket.text
        assert "ORD-" in ticket.text or answer.order_id is None
        assert parse_answer(answer_json(answer)) == answer


def test_the_request_is_an_openai_chat_request_with_the_system_prompt(
    splits: tuple[list[Ticket], list[Ticket]],
) -> None:
    ticket = splits[1][0]
    request = ticket.request()
    assert request["model"] == TEACHER_MODEL
    assert request["messages"] == [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": ticket.text},
    ]
    assert all(name in SYSTEM_PROMPT for name in FIELDS)
    assert ANSWER_SCHEMA["required"] == list(FIELDS)


def test_the_cli_writes_a_split_as_jsonl_requests(tmp_path: Path) -> None:
    out = tmp_path / "heldout.jsonl"
    assert tickets.main(["--split", "heldout", "--out", str(out), "--model", "m-1"]) == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines == [t.request("m-1") for t in generate("heldout")]


# --- the grader -----------------------------------------------------------------------------

EXPECTED = TicketFields(
    category="returns",
    priority="high",
    product="Lumo desk lamp",
    order_id="ORD-123456",
    customer_name="Maria Lopez",
    sentiment="negative",
    refund_requested=True,
)


def test_a_perfect_answer_scores_one_and_each_wrong_field_costs_a_seventh() -> None:
    assert field_accuracy(EXPECTED, answer_json(EXPECTED)) == 1.0
    got = EXPECTED.model_dump() | {"priority": "low", "order_id": None}
    assert field_scores(EXPECTED, got) == dict.fromkeys(FIELDS, True) | {
        "priority": False,
        "order_id": False,
    }
    assert field_accuracy(EXPECTED, json.dumps(got)) == pytest.approx(5 / 7)


def test_strings_compare_trimmed_and_caseless_but_types_strictly() -> None:
    loose = EXPECTED.model_dump() | {"product": " lumo DESK lamp ", "category": "Returns"}
    assert field_accuracy(EXPECTED, loose) == 1.0
    assert not field_scores(EXPECTED, EXPECTED.model_dump() | {"refund_requested": 1})[
        "refund_requested"
    ]
    assert not field_scores(EXPECTED, EXPECTED.model_dump() | {"refund_requested": "true"})[
        "refund_requested"
    ]
    missing = EXPECTED.model_dump()
    del missing["sentiment"]
    assert field_accuracy(EXPECTED, missing) == pytest.approx(6 / 7)


@pytest.mark.parametrize("text", ["", "not json", "[1, 2]", '{"category": "returns"', "null"])
def test_an_answer_that_is_not_a_json_object_scores_zero(text: str) -> None:
    assert field_accuracy(EXPECTED, text) == 0.0
    assert parse_answer(text) is None


# --- sizes in SmolLM2's tokens ------------------------------------------------------------------


@pytest.mark.slow
def test_prompts_are_about_150_tokens_and_answers_under_80(
    smollm2_dir: Path, splits: tuple[list[Ticket], list[Ticket]]
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    prompts = [
        len(
            tokenizer.apply_chat_template(
                t.messages(), add_generation_prompt=True, return_dict=True
            )["input_ids"]
        )
        for t in splits[0]
    ]
    answers = [len(tokenizer(answer_json(t.answer))["input_ids"]) for t in splits[0]]
    assert 100 <= statistics.mean(prompts) <= 160
    assert max(prompts) <= 200
    assert max(answers) < 80

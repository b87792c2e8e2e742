"""The recipe's decisions, pinned for the data profiles a user brings: tiny and large, short and
long, JSON, free text, labels and tool calls. Each decision must carry a reason naming its rule."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from services.scheduler.analysis import DatasetProfile, Lengths, profile_dataset, task_kind
from services.scheduler.recipe import (
    MIN_STEPS,
    Plan,
    UserChoices,
    openai_epochs,
    plan,
)
from services.scheduler.throughput import THROUGHPUT
from shared.chat import Sample

CPU = THROUGHPUT["cpu"]
GPU = THROUGHPUT["gpu-80g"]
SMOL = {"params": 135_000_000, "context_len": 8192}


def profile(
    n: int,
    *,
    example: tuple[int, int, int] = (140, 170, 190),
    completion: tuple[int, int, int] = (60, 70, 80),
    json_share: float = 0.0,
    tool_share: float = 0.0,
    distinct: int = 10_000,
) -> DatasetProfile:
    return DatasetProfile(
        n_train=n,
        n_eval=max(1, n // 10),
        example=Lengths(*example, example[2]),
        completion=Lengths(*completion, completion[2]),
        json_share=json_share,
        tool_share=tool_share,
        distinct_answers=distinct,
    )


def test_the_demo_task_on_cpu_trains_two_epochs_of_short_rows() -> None:
    # 400 tickets of ~140 tokens answered with JSON: KNOWLEDGE's measured task.
    result = plan(profile(400, json_share=1.0), CPU, **SMOL)
    assert result.task_kind == "json"
    hp = result.trainer["hyperparameters"]
    assert hp["max_seq_len"] == 208  # p99 190 + 3 %, rounded up to 16
    assert hp["micro_batch_size"] * hp["gradient_accumulation_steps"] == 4
    assert result.n_epochs == 2.0  # OpenAI's 3, clamped to the table's 0.5-2
    assert result.steps == 200
    assert hp["learning_rate"] == pytest.approx(2e-4)
    assert 6 <= result.eval_points <= 10
    assert result.trainer["checkpoints"]["every_n_steps"] == result.eval_every
    assert result.trainer["checkpoints"]["keep_last"] > result.eval_points
    reasons = result.reasons()
    assert "OpenAI" in reasons["n_epochs"]
    assert "0.5-2" in reasons["n_epochs"]
    assert "measured" in reasons["rows_per_step"]


def test_a_time_budget_cuts_the_run_and_keeps_many_small_steps() -> None:
    full = plan(profile(400, json_share=1.0), CPU, **SMOL)
    fitted = plan(profile(400, json_share=1.0), CPU, **SMOL, user=UserChoices(max_duration_s=360))
    assert fitted.estimated_s <= 360 < full.estimated_s
    assert fitted.eval_points == 6
    # Four-row steps would leave under 100 of them: one-row steps, more of them, same time.
    hp = fitted.trainer["hyperparameters"]
    assert hp["micro_batch_size"] * hp["gradient_accumulation_steps"] == 1
    assert fitted.steps >= MIN_STEPS
    assert fitted.batch_size * fitted.steps < full.batch_size * full.steps  # fewer examples seen
    reasons = fitted.reasons()
    assert "max_duration_s 360" in reasons["steps"]
    assert "one row a step" in reasons["rows_per_step"]


def test_a_budget_too_small_for_the_floor_raises_the_short_run_rate() -> None:
    fitted = plan(profile(400, json_share=1.0), CPU, **SMOL, user=UserChoices(max_duration_s=150))
    assert fitted.steps < MIN_STEPS
    assert fitted.trainer["hyperparameters"]["learning_rate"] == pytest.approx(3e-4)
    assert "under 100 steps" in fitted.reasons()["learning_rate"]


def test_a_tiny_dataset_gets_small_steps_then_more_epochs_to_reach_the_floor() -> None:
    result = plan(profile(40, json_share=1.0), CPU, **SMOL)
    hp = result.trainer["hyperparameters"]
    assert hp["micro_batch_size"] * hp["gradient_accumulation_steps"] == 1
    assert result.steps >= MIN_STEPS
    assert result.n_epochs == 3.0  # 40 one-example steps an epoch: 3 epochs for >= 100 steps
    assert "floor" in result.reasons()["n_epochs"]


def test_a_large_free_text_dataset_on_gpu_packs_long_rows_within_openais_bound() -> None:
    result = plan(
        profile(20_000, example=(600, 1500, 3000), completion=(300, 900, 2000)), GPU, **SMOL
    )
    assert result.task_kind == "free_text"
    hp = result.trainer["hyperparameters"]
    assert hp["max_seq_len"] == 3104  # 3000 + 3 %, rounded up to 16, above GPU's 2048
    assert openai_epochs(20_000) == 1
    assert result.n_epochs == 1.0  # the table's 1-3 takes OpenAI's 1
    assert hp["micro_batch_size"] * hp["gradient_accumulation_steps"] * 3104 >= 32_768 - 3104
    assert result.steps >= MIN_STEPS


def test_long_examples_are_capped_by_the_context_length() -> None:
    result = plan(
        profile(500, example=(5000, 9000, 12_000), completion=(400, 800, 1000)), CPU, **SMOL
    )
    assert result.trainer["hyperparameters"]["max_seq_len"] == 8192


def test_tool_calling_data_trains_more_epochs() -> None:
    result = plan(profile(300, tool_share=0.6, json_share=0.9), CPU, **SMOL)
    assert result.task_kind == "tool_calls"  # tools win over JSON-looking turns
    assert result.n_epochs == 3.0  # table 3-5, OpenAI's 3 inside it
    assert "OpenAI" in result.reasons()["n_epochs"]


def test_short_labels_are_recognised() -> None:
    labels = profile(1000, completion=(2, 3, 4), example=(80, 100, 120), distinct=4)
    assert task_kind(labels)[0] == "short_label"
    many = profile(1000, completion=(2, 3, 4), example=(80, 100, 120), distinct=500)
    assert task_kind(many)[0] == "free_text"
    # A turn's template tokens are not the answer's: "needs human review" is 9 tokens as a
    # SmolLM2 turn and 3 as an answer; the rule reads the answer when the stats have it.
    templated = profile(1000, completion=(8, 9, 9), example=(80, 100, 120), distinct=4)
    assert task_kind(templated)[0] == "free_text"
    answered = replace(templated, answer=Lengths(2, 3, 3, 3))
    kind, rule = task_kind(answered)
    assert kind == "short_label"
    assert "p90 3 <= 8" in rule


def test_user_values_win_and_are_marked_as_the_users() -> None:
    result: Plan = plan(
        profile(400, json_share=1.0),
        CPU,
        **SMOL,
        user=UserChoices(n_epochs=1, batch_size=8, learning_rate_multiplier=0.5),
    )
    by_name = {d.name: d for d in result.decisions}
    assert result.n_epochs == 1
    assert by_name["n_epochs"].source == "user"
    assert result.batch_size == 8
    assert result.steps == 50  # 400 examples, 8 a step, one epoch: under the floor, as asked
    # Exactly 8 examples a step: one a row, unpacked (a packed row holds as many as fit).
    hp = result.trainer["hyperparameters"]
    assert hp["packing"] is False
    assert hp["micro_batch_size"] * hp["gradient_accumulation_steps"] == 8
    assert "unpacked" in by_name["rows_per_step"].reason
    odd = plan(profile(400, json_share=1.0), CPU, **SMOL, user=UserChoices(batch_size=3))
    assert odd.batch_size == 3  # a packed row of ~2 examples could not say 3
    assert plan(profile(400, json_share=1.0), CPU, **SMOL).trainer["hyperparameters"]["packing"]
    # The short-run LoRA rate (3e-4) times the given multiplier.
    assert result.trainer["hyperparameters"]["learning_rate"] == pytest.approx(1.5e-4)
    assert by_name["learning_rate"].source == "user"


@pytest.mark.parametrize(
    ("n", "expected"), [(10, 10), (20, 5), (33, 3), (400, 3), (9000, 2), (30_000, 1)]
)
def test_openais_auto_epochs(n: int, expected: int) -> None:
    assert openai_epochs(n) == expected


def test_every_decision_has_a_reason() -> None:
    for result in (
        plan(profile(400, json_share=1.0), CPU, **SMOL),
        plan(profile(50, tool_share=1.0), GPU, **SMOL, user=UserChoices(max_duration_s=60)),
    ):
        assert result.decisions
        assert all(d.reason.strip() for d in result.decisions)


def _sample(answer: str) -> Sample:
    return Sample.model_validate(
        {
            "tenant": "acme",
            "source": "upload",
            "created_at": datetime(2026, 1, 1, tzinfo=UTC),
            "messages": [
                {"role": "user", "content": "ticket"},
                {"role": "assistant", "content": answer},
            ],
        }
    )


def test_a_profile_reads_the_snapshot_stats_and_the_answers() -> None:
    stats = {
        "train": {
            "count": 3,
            "tokens": {
                "prompt": {"p50": 100, "p90": 120, "p99": 130, "max": 131},
                "completion": {"p50": 40, "p90": 50, "p99": 60, "max": 61},
            },
        },
        "eval": {"count": 1},
    }
    samples = [_sample('{"a": 1}'), _sample('{"a": 2}'), _sample("not json")]
    result = profile_dataset(stats, samples)
    assert result.answer is None  # stats written before answers were counted
    stats["train"]["tokens"]["answer"] = {"p50": 3, "p90": 4, "p99": 5, "max": 6}
    assert profile_dataset(stats, samples).answer == Lengths(3, 4, 5, 6)
    assert (result.n_train, result.n_eval) == (3, 1)
    assert result.example.p99 == 190
    assert result.json_share == pytest.approx(2 / 3)
    assert result.distinct_answers == 3

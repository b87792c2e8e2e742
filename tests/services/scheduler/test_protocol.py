"""The jobs API takes what the openai SDK sends, and refuses what OpenAI refuses, by field."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from services.scheduler.protocol import JobCreate, checkpoint_name, fine_tuned_name


def create(**fields: Any) -> JobCreate:
    return JobCreate.model_validate(
        {"model": "SmolLM2-135M-Instruct", "training_file": "file-1", **fields}
    )


def test_method_hyperparameters_and_the_deprecated_field_both_work() -> None:
    by_method = create(
        method={"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 2}}}
    )
    assert by_method.chosen().n_epochs == 2
    assert by_method.chosen().batch_size == "auto"
    deprecated = create(hyperparameters={"learning_rate_multiplier": 0.5})
    assert deprecated.chosen().learning_rate_multiplier == 0.5
    assert create().chosen().n_epochs == "auto"


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"hyperparameters": {"n_epochs": 0}}, "n_epochs"),
        ({"hyperparameters": {"n_epochs": 51}}, "n_epochs"),
        ({"hyperparameters": {"batch_size": "big"}}, "batch_size"),
        ({"hyperparameters": {"learning_rate_multiplier": -1}}, "learning_rate_multiplier"),
        ({"method": {"type": "dpo"}}, "type"),
        ({"suffix": "has:colon"}, "suffix"),
        ({"suffix": "x" * 65}, "suffix"),
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
        ({"integrations": [{"type": "wandb"}]}, "integrations"),
        ({"max_duration_s": 0}, "max_duration_s"),
        ({"unknown": 1}, "unknown"),
        (
            {
                "hyperparameters": {"n_epochs": 2},
                "method": {"type": "supervised"},
            },
            "hyperparameters",
        ),
    ],
)
def test_bad_requests_name_the_field(fields: dict[str, Any], named: str) -> None:
    with pytest.raises(ValidationError) as caught:
        create(**fields)
    assert named in str(caught.value)


def test_fine_tuned_names_follow_openais_shape() -> None:
    name = fine_tuned_name("SmolLM2-135M-Instruct", "tickets", "ftjob-abc")
    assert name == "ft:SmolLM2-135M-Instruct:tickets:ftjob-abc"
    assert fine_tuned_name("SmolLM2-135M-Instruct", None, "ftjob-abc") == (
        "ft:SmolLM2-135M-Instruct::ftjob-abc"
    )
    assert checkpoint_name(name, 40) == "ft:SmolLM2-135M-Instruct:tickets:ftjob-abc:ckpt-step-40"

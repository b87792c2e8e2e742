"""What the Evals API tests send and read through the gateway with the `openai` SDK: inline
items, runs over them, a judged eval and its fake judge, a dataset built by ingest, output items,
and the status, field and message of a refusal."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from shared.dev import localstack
from tests.services.evaluator.evals_stack import ITEM_SCHEMA, Stack

JUDGE = "gpt-4o-judge"
CONFIG = {"type": "custom", "item_schema": ITEM_SCHEMA, "include_sample_schema": True}


def verdict(messages: list[dict[str, Any]]) -> str:
    """The judge: Paris is correct (0.9), anything else a 0.4, a garbled answer garbled twice."""
    conversation = json.dumps(messages)
    if "garbled" in conversation:
        return "I think it is fine"
    if any('{"label"' in m["content"] for m in messages):
        label = "correct" if "Paris" in conversation else "incorrect"
        return json.dumps({"label": label, "assessment": "checked against the reference"})
    return json.dumps({"score": 0.9 if "Paris" in conversation else 0.4, "assessment": "close"})


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def template(*messages: tuple[str, str]) -> dict[str, Any]:
    return {"type": "template", "template": [{"role": r, "content": c} for r, c in messages]}


def inline(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {"type": "file_content", "content": rows}


def jsonl_run(client: openai.OpenAI, eval_id: str, rows: list[dict[str, Any]]) -> Any:
    return client.evals.runs.create(eval_id, data_source={"type": "jsonl", "source": inline(rows)})


def judged_eval(client: openai.OpenAI) -> str:
    messages = [{"role": "user", "content": "Question: {{item.question}} Reference: "
                 "{{item.answer}} Answer: {{sample.output_text}}"}]  # fmt: skip
    criteria: list[Any] = [
        {"type": "label_model", "name": "right", "model": JUDGE, "input": messages,
         "labels": ["correct", "incorrect"], "passing_labels": ["correct"]},
        {"type": "score_model", "name": "quality", "model": JUDGE, "input": messages,
         "range": [0, 1], "pass_threshold": 0.5},
    ]  # fmt: skip
    return client.evals.create(data_source_config=CONFIG, testing_criteria=criteria).id


def refusal(call: Callable[[], object]) -> tuple[int, str | None, str]:
    """The status, OpenAI's `param` and the message of the error `call` raises."""
    with pytest.raises(openai.APIStatusError) as caught:
        call()
    return caught.value.status_code, caught.value.param, caught.value.message


def output_items(client: openai.OpenAI, eval_id: str, run_id: str, **params: Any) -> list[Any]:
    return client.evals.runs.output_items.list(run_id, eval_id=eval_id, limit=100, **params).data


def built_dataset(stack: Stack) -> str:
    """A dataset built by ingest whose eval split is one sample (France, answered Paris)."""
    client = stack.client

    def upload(name: str, lines: list[tuple[str, str]]) -> str:
        body = "".join(json.dumps({"messages": [{"role": "user", "content": q},
                                                {"role": "assistant", "content": a}]}) + "\n"
                       for q, a in lines).encode()  # fmt: skip
        file_id = client.files.create(file=(name, io.BytesIO(body)), purpose="fine-tune").id
        assert localstack.wait_until(
            lambda: client.files.retrieve(file_id).status == "processed", 30, interval_s=0.2
        )
        return file_id

    train = upload("train.jsonl", [("Name a primary colour.", "Red"), ("Say hello.", "Hello")])
    held_out = upload("eval.jsonl", [("What is the capital of France?", "Paris")])
    spec = {"name": "capitals", "file_ids": [train], "eval_file_ids": [held_out]}
    created = httpx.post(f"{stack.url}/v1/datasets", json=spec, headers=auth(stack.key))
    assert created.status_code == 202, created.text
    dataset_id = str(created.json()["id"])
    found: dict[str, Any] = {}

    def built() -> bool:
        nonlocal found
        found = httpx.get(f"{stack.url}/v1/datasets/{dataset_id}", headers=auth(stack.key)).json()
        return found["status"] in ("built", "failed")

    assert localstack.wait_until(built, 90, interval_s=0.25), found
    assert (found["status"], found["eval_count"]) == ("built", 1), found
    return dataset_id

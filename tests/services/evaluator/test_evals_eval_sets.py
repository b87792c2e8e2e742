"""An Evals API run over an eval set (ingest's `evs_...`, refreshed from captured traffic),
driven through the gateway with the official `openai` SDK on real processes
(tests/services/evaluator/evals_stack.py): the items are the version's samples, a pinned
version (`evs_...@N`) stays what it was after a refresh, a run over the latest records the
version it read, and ingest's refusals come back naming `data_source.source.id`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from shared.dev import localstack
from shared.settings import Settings
from tests.plugins.infra import RunningProcess
from tests.services.evaluator.evals_stack import Stack, running, until_done

CAPTURED, CANDIDATE = "gpt-4o-mini", "gpt-4.1-mini"
QUESTIONS = ["What is the capital of France?", "What is 2 + 2?", "Name the largest planet."]
ITEM_SCHEMA: dict[str, object] = {
    "type": "object",
    "properties": {"messages": {"type": "array"}, "reference": {"type": "string"}},
    "required": ["messages", "reference"],
}
SAME: Any = {"type": "string_check", "name": "same", "input": "{{sample.output_text}}",
        "reference": "{{item.reference}}", "operation": "eq"}  # fmt: skip


@pytest.fixture(scope="module")
def stack(
    nats_server: RunningProcess,
    s3_server: RunningProcess,
    stack_settings: Settings,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Stack]:
    with running(tmp_path_factory.mktemp("evals-eval-sets"), stack_settings) as started:
        # The candidate regresses on one question the captured model answered.
        started.upstream.answers[CANDIDATE] = {"2 + 2": "5"}
        yield started


def ask(stack: Stack, questions: list[str]) -> None:
    """Traffic through the gateway, tagged, and waited for in the sample store."""
    for question in questions:
        stack.client.chat.completions.create(
            model=CAPTURED,
            messages=[{"role": "user", "content": question}],
            extra_headers={"x-tuneloop-tags": "support"},
        )

    def stored() -> bool:
        found = httpx.get(
            f"{stack.url}/v1/samples",
            params={"tag": "support", "limit": 100},
            headers={"Authorization": f"Bearer {stack.key}"},
        )
        return all(question in found.text for question in questions)

    assert localstack.wait_until(stored, 40, interval_s=0.3)


def refresh(stack: Stack, eval_set_id: str) -> dict[str, Any]:
    answer = httpx.post(
        f"{stack.url}/v1/eval_sets/{eval_set_id}/refresh",
        headers={"Authorization": f"Bearer {stack.key}"},
        timeout=60,
    )
    assert answer.status_code == 201, answer.text
    version: dict[str, Any] = answer.json()
    return version


def questions(items: list[Any]) -> set[str]:
    """What each output item's eval set sample asked."""
    return {str(item.datasource_item["messages"][0]["content"]) for item in items}


def run_over(client: openai.OpenAI, eval_id: str, source_id: str, model: str) -> Any:
    return client.evals.runs.create(
        eval_id,
        data_source={
            "type": "completions",
            "model": model,
            "source": {"type": "file_id", "id": source_id},
            "input_messages": {"type": "item_reference", "item_reference": "item.messages"},
        },
    )


@pytest.mark.slow
def test_an_eval_run_reads_an_eval_set_version(stack: Stack) -> None:
    client = stack.client
    ask(stack, QUESTIONS)
    created = httpx.post(
        f"{stack.url}/v1/eval_sets",
        json={"name": "support", "source": {"tags": ["support"]}, "size": 3},
        headers={"Authorization": f"Bearer {stack.key}"},
    )
    assert created.status_code == 201, created.text
    eval_set = created.json()["id"]
    assert refresh(stack, eval_set)["item_count"] == 3

    eval_id = client.evals.create(
        name="support answers",
        data_source_config={"type": "custom", "item_schema": ITEM_SCHEMA,
                            "include_sample_schema": True},
        testing_criteria=[SAME],
    ).id  # fmt: skip
    # The captured model answers as it did: every item passes; the candidate regresses on one.
    same = until_done(client, eval_id, run_over(client, eval_id, eval_set, CAPTURED).id)
    assert same.status == "completed", same
    assert same.result_counts.model_dump() == {"total": 3, "passed": 3, "failed": 0, "errored": 0}
    # Run over the latest, it names the version it read, as the runs listed name it too.
    assert same.data_source.source.id == f"{eval_set}@1"
    listed = client.evals.runs.list(eval_id).data
    assert [r.data_source.source.id for r in listed if r.id == same.id] == [f"{eval_set}@1"]
    regressed = run_over(client, eval_id, f"{eval_set}@1", CANDIDATE)
    done = until_done(client, eval_id, regressed.id)
    assert done.result_counts.model_dump() == {"total": 3, "passed": 2, "failed": 1, "errored": 0}
    items = client.evals.runs.output_items.list(regressed.id, eval_id=eval_id, limit=10).data
    [failed] = [item for item in items if item.status == "fail"]
    assert failed.datasource_item == {
        "messages": [{"role": "user", "content": "What is 2 + 2?"}],
        "reference": "4",
    }
    assert failed.sample.output[0].content == "5"
    assert questions(items) == set(QUESTIONS)

    # A newer question makes version 2 (size 3: the oldest question leaves); @1 stays as it was.
    ask(stack, ["Spell cat backwards."])
    assert refresh(stack, eval_set)["report"]["new_items"] == 1
    latest = until_done(client, eval_id, run_over(client, eval_id, eval_set, CAPTURED).id)
    pinned = until_done(client, eval_id, run_over(client, eval_id, f"{eval_set}@1", CAPTURED).id)
    latest_items = client.evals.runs.output_items.list(latest.id, eval_id=eval_id).data
    pinned_items = client.evals.runs.output_items.list(pinned.id, eval_id=eval_id).data
    assert questions(latest_items) == set(QUESTIONS[1:]) | {"Spell cat backwards."}
    assert questions(pinned_items) == set(QUESTIONS)
    assert (latest.data_source.source.id, pinned.data_source.source.id) == (
        f"{eval_set}@2", f"{eval_set}@1")  # fmt: skip

    for source_id, error in [
        (f"{eval_set}@9", openai.NotFoundError),  # no such version
        (f"{eval_set}@0", openai.UnprocessableEntityError),  # versions count from 1
    ]:
        with pytest.raises(error, match=r"data_source\.source\.id"):
            run_over(client, eval_id, source_id, CAPTURED)
    # Another tenant's eval set is unknown to this key.
    other_eval = stack.other.evals.create(
        data_source_config={"type": "custom", "item_schema": ITEM_SCHEMA,
                            "include_sample_schema": True},
        testing_criteria=[SAME],
    ).id  # fmt: skip
    with pytest.raises(openai.NotFoundError, match="not found"):
        run_over(stack.other, other_eval, eval_set, CAPTURED)

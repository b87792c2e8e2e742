"""The Evals API driven by the official `openai` SDK through the gateway, on real processes
(ingest, evaluator, nats-server, SeaweedFS, SQLite) with a fake OpenAI upstream that answers
each question its own way: an eval is created, run (the model answering through the gateway
with the caller's key, and an uploaded `evals` file of given samples), polled to the end, and its
output items graded exactly; bad input is refused naming the field; another tenant sees none
of it."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator

import httpx
import openai
import pytest

from shared.dev import localstack
from shared.settings import Settings
from tests.plugins.infra import RunningProcess
from tests.services.evaluator.evals_stack import (
    CRITERIA,
    ITEM_SCHEMA,
    QUESTIONS,
    Stack,
    completions_run,
    create_eval,
    running,
    until_done,
)
from tests.services.evaluator.evals_stack import scores as _scores


@pytest.fixture(scope="module")
def stack(
    nats_server: RunningProcess,
    s3_server: RunningProcess,
    stack_settings: Settings,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Stack]:
    with running(tmp_path_factory.mktemp("evals"), stack_settings) as started:
        yield started


@pytest.mark.slow
def test_an_eval_runs_a_model_through_the_gateway_and_grades_each_item(stack: Stack) -> None:
    client = stack.client
    eval_id = create_eval(client)
    fetched = client.evals.retrieve(eval_id)
    assert fetched.name == "capitals"
    assert fetched.metadata == {"team": "qa"}
    assert fetched.data_source_config.schema_["properties"]["item"] == ITEM_SCHEMA
    assert [c.name for c in fetched.testing_criteria] == ["exact", "mentions", "close", "rouge"]
    assert eval_id in [e.id for e in client.evals.list(limit=10).data]
    assert client.evals.update(eval_id, name="capitals v2").name == "capitals v2"

    run = completions_run(client, eval_id, "gpt-4o-mini", QUESTIONS)
    assert run.status == "queued"
    done = until_done(client, eval_id, run.id)
    assert done.status == "completed", done
    assert done.model == "gpt-4o-mini"
    assert done.result_counts.model_dump() == {"total": 5, "passed": 1, "failed": 3, "errored": 1}
    assert [(r.testing_criteria, r.passed, r.failed) for r in done.per_testing_criteria_results] == [
        ("exact", 1, 3), ("mentions", 3, 1), ("close", 2, 2), ("rouge", 2, 2)]  # fmt: skip
    [usage] = done.per_model_usage
    assert (usage.run_model_name, usage.invocation_count, usage.total_tokens) == (
        "gpt-4o-mini", 5, 92)  # fmt: skip

    items = client.evals.runs.output_items.list(run.id, eval_id=eval_id, limit=10).data
    assert [i.datasource_item_id for i in items] == [0, 1, 2, 3, 4]
    assert [i.status for i in items] == ["pass", "fail", "fail", "fail", "error"]
    paris, four, jupiter, tac, refused = items
    assert paris.sample.output[0].content == "Paris"
    assert paris.sample.input[1].content == "What is the capital of France?"
    assert _scores(paris) == {"exact": (1.0, True), "mentions": (1.0, True),
                              "close": (1.0, True), "rouge": (1.0, True)}  # fmt: skip
    assert _scores(four) == {"exact": (0.0, False), "mentions": (0.0, False),
                             "close": (0.0, False), "rouge": (0.0, False)}  # fmt: skip
    # "Jupiter is the largest planet." against "Jupiter": 2*7/37 by characters; ROUGE-L words
    # 1 of 5 and 1 of 1: 2*0.2*1/1.2.
    assert _scores(jupiter) == {"exact": (0.0, False), "mentions": (1.0, True),
                                "close": (round(14 / 37, 4), False),
                                "rouge": (round(1 / 3, 4), False)}  # fmt: skip
    # "Tac" against "tac": case matters to eq and fuzzy_match, not to ilike and ROUGE-L.
    assert _scores(tac) == {"exact": (0.0, False), "mentions": (1.0, True),
                            "close": (round(4 / 6, 4), True), "rouge": (1.0, True)}  # fmt: skip
    assert refused.sample.error.message == "This prompt was refused."
    assert all("This prompt was refused." in r.error for r in refused.results)
    one = client.evals.runs.output_items.retrieve(tac.id, eval_id=eval_id, run_id=run.id)
    assert one.datasource_item == QUESTIONS[3]

    # The calls went through the gateway with the caller's key, tagged with the run.
    sent = stack.upstream.requests[0]
    assert sent["messages"][0] == {"role": "system", "content": "Answer briefly."}
    assert sent["max_completion_tokens"] == 32
    tagged = f"eval_run:{run.id}"

    def captured() -> bool:
        samples = httpx.get(f"{stack.url}/v1/samples", params={"tag": tagged, "status": "ok"},
                            headers={"Authorization": f"Bearer {stack.key}"}).json()["data"]  # fmt: skip
        return len(samples) == 4

    assert localstack.wait_until(captured, 40, interval_s=0.3)


@pytest.mark.slow
def test_a_jsonl_run_reads_an_uploaded_file_and_bad_input_names_the_field(stack: Stack) -> None:
    client = stack.client
    eval_id = create_eval(client)
    lines = [
        {"item": QUESTIONS[0], "sample": {"output_text": "Paris"}},
        {"item": QUESTIONS[2], "sample": {"output_text": "Jupiter"}},
        {"item": QUESTIONS[1], "sample": {"output_text": "four"}},
    ]
    body = "".join(json.dumps(line) + "\n" for line in lines).encode()
    # OpenAI's eval file format, uploaded with its purpose: checked by ingest, kept as it is.
    uploaded = client.files.create(file=("items.jsonl", io.BytesIO(body)), purpose="evals")
    assert uploaded.purpose == "evals"
    run = client.evals.runs.create(
        eval_id, data_source={"type": "jsonl", "source": {"type": "file_id", "id": uploaded.id}}
    )
    done = until_done(client, eval_id, run.id)
    assert done.result_counts.model_dump() == {"total": 3, "passed": 2, "failed": 1, "errored": 0}
    assert client.files.retrieve(uploaded.id).status_details == "3 eval items"
    # A bad line fails the file, and a run over it is refused with the line named.
    broken = body + b'{"item": "What is 2 + 2?"}\n'
    bad = client.files.create(file=("broken.jsonl", io.BytesIO(broken)), purpose="evals")
    assert localstack.wait_until(
        lambda: client.files.retrieve(bad.id).status == "error", 30, interval_s=0.2
    )
    with pytest.raises(openai.UnprocessableEntityError) as refused_file:
        client.evals.runs.create(
            eval_id, data_source={"type": "jsonl", "source": {"type": "file_id", "id": bad.id}}
        )
    assert refused_file.value.param == "data_source.source.id"
    assert f'{bad.id}: line 4: "item": must be a JSON object (a str)' in refused_file.value.message
    passing = client.evals.runs.output_items.list(run.id, eval_id=eval_id, status="pass").data
    assert [i.datasource_item_id for i in passing] == [0, 1]
    with pytest.raises(openai.ConflictError, match="only a queued or in-progress run"):
        client.evals.runs.cancel(run.id, eval_id=eval_id)

    bad = dict(CRITERIA[0], operation="contains")
    with pytest.raises(openai.UnprocessableEntityError) as refused:
        client.evals.create(
            data_source_config={"type": "custom", "item_schema": ITEM_SCHEMA},
            testing_criteria=[bad],
        )
    assert "testing_criteria.0.string_check.operation" in refused.value.message
    typo = dict(CRITERIA[0], reference="{{item.answr}}")
    with pytest.raises(openai.UnprocessableEntityError, match=r"testing_criteria\[0\].reference"):
        client.evals.create(
            data_source_config={
                "type": "custom",
                "item_schema": ITEM_SCHEMA,
                "include_sample_schema": True,
            },
            testing_criteria=[typo],
        )
    not_an_item = {"type": "file_content", "content": [{"item": {"question": "q"}}]}
    with pytest.raises(openai.UnprocessableEntityError, match='"answer" is a required property'):
        client.evals.runs.create(eval_id, data_source={"type": "jsonl", "source": not_an_item})
    with pytest.raises(openai.UnprocessableEntityError, match=r"data_source\.model: required"):
        client.evals.runs.create(eval_id, data_source={
            "type": "completions", "source": {"type": "file_content", "content": [{"item": QUESTIONS[0]}]},
            "input_messages": {"type": "template", "template": [{"role": "user", "content": "x"}]}})  # fmt: skip

    deleted = client.evals.runs.delete(run.id, eval_id=eval_id)
    assert (deleted.deleted, deleted.run_id) == (True, run.id)
    with pytest.raises(openai.NotFoundError):
        client.evals.runs.retrieve(run.id, eval_id=eval_id)


@pytest.mark.slow
def test_another_tenant_sees_none_of_it(stack: Stack) -> None:
    eval_id = create_eval(stack.client)
    content = [{"item": QUESTIONS[0], "sample": {"output_text": "Paris"}}]
    run = stack.client.evals.runs.create(
        eval_id,
        data_source={"type": "jsonl", "source": {"type": "file_content", "content": content}},
    )
    until_done(stack.client, eval_id, run.id)
    other = stack.other
    with pytest.raises(openai.NotFoundError, match="eval_id"):
        other.evals.retrieve(eval_id)
    assert eval_id not in [e.id for e in other.evals.list(limit=100).data]
    with pytest.raises(openai.NotFoundError):
        other.evals.runs.retrieve(run.id, eval_id=eval_id)
    with pytest.raises(openai.NotFoundError):
        other.evals.runs.output_items.list(run.id, eval_id=eval_id)
    with pytest.raises(openai.NotFoundError):
        other.evals.runs.create(eval_id, data_source={"type": "jsonl", "source": {
            "type": "file_content", "content": content}})  # fmt: skip
    with pytest.raises(openai.NotFoundError):
        other.evals.delete(eval_id)
    deleted = stack.client.evals.delete(eval_id)
    assert (deleted.deleted, deleted.eval_id) == (True, eval_id)

"""The Evals API's routes through the gateway with the official `openai` SDK, on real processes
(evals_stack.py: ingest as the gateway, the evaluator, nats-server, SeaweedFS, SQLite; only the
OpenAI upstream is a fake). Results are checked exactly; bad input is refused naming the field;
another tenant sees nothing and a read key changes nothing; a cancel stops a run whose calls are
in flight.

The main flow (five items graded by four criteria, an uploaded file, the calls captured with
their tag) is test_evals_sdk.py's; versions side by side test_evals_compare.py's; a restart of
the evaluator mid-run test_evals_restart.py's.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest

from shared.dev import localstack
from shared.settings import Settings
from tests.plugins.infra import RunningProcess
from tests.services.evaluator.evals_calls import (
    CONFIG,
    JUDGE,
    built_dataset,
    inline,
    jsonl_run,
    judged_eval,
    output_items,
    refusal,
    template,
    verdict,
)
from tests.services.evaluator.evals_stack import (
    CRITERIA,
    QUESTIONS,
    Stack,
    completions_run,
    create_eval,
    running,
    tenant_key,
    until_done,
)

MAX_ITEMS = 40  # TUNELOOP_EVALUATOR_EVALS_MAX_ITEMS of this module's evaluator


@pytest.fixture(scope="module")
def stack(
    nats_server: RunningProcess,
    s3_server: RunningProcess,
    stack_settings: Settings,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Stack]:
    limit = {"TUNELOOP_EVALUATOR_EVALS_MAX_ITEMS": str(MAX_ITEMS)}
    with running(tmp_path_factory.mktemp("evals-api"), stack_settings, limit) as started:
        started.upstream.judges[JUDGE] = verdict
        yield started


@pytest.mark.slow
def test_the_prompt_sent_and_the_usage_counted_exactly(stack: Stack) -> None:
    client, model = stack.client, "gpt-4o-prompted"
    eval_id = create_eval(client)
    prompt = template(("developer", "Answer in one word."), ("user", "Q: {{item.question}}"))
    run = client.evals.runs.create(eval_id, data_source={
        "type": "completions", "model": model, "source": inline([{"item": q} for q in QUESTIONS]),
        "input_messages": prompt,
        "sampling_params": {"temperature": 0, "max_completion_tokens": 16, "seed": 7}})  # fmt: skip
    done = until_done(client, eval_id, run.id)
    assert done.status == "completed", done
    # Five calls, four answered (20 prompt and 3 completion tokens each), one refused.
    assert [u.to_dict() for u in done.per_model_usage] == [{
        "model_name": model, "invocation_count": 5, "prompt_tokens": 80,
        "completion_tokens": 12, "total_tokens": 92, "cached_tokens": 0}]  # fmt: skip
    sent = stack.upstream.sent_to(model)
    assert len(sent) == 5
    first = next(body for body in sent if "capital" in body["messages"][-1]["content"])
    # A developer message goes out as system; the sampling values as given.
    assert first["messages"] == [
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": "Q: What is the capital of France?"},
    ]
    assert (first["temperature"], first["max_completion_tokens"], first["seed"]) == (0, 16, 7)

    items = output_items(client, eval_id, run.id)
    paris, refused = items[0], items[4]
    assert paris.sample.to_dict()["output"] == [{"role": "assistant", "content": "Paris"}]
    assert paris.sample.to_dict()["input"][1] == {
        "role": "user", "content": "Q: What is the capital of France?"}  # fmt: skip
    assert paris.sample.to_dict()["seed"] == 7
    assert refused.sample.error.to_dict() == {"code": "400", "message": "This prompt was refused."}
    assert refused.datasource_item == QUESTIONS[4]
    one = client.evals.runs.output_items.retrieve(paris.id, eval_id=eval_id, run_id=run.id)
    assert one.to_dict() == paris.to_dict()
    assert [i.datasource_item_id for i in output_items(client, eval_id, run.id, status="fail")] == [
        1, 2, 3]  # fmt: skip
    assert [
        i.datasource_item_id for i in output_items(client, eval_id, run.id, status="error")
    ] == [4]


@pytest.mark.slow
def test_jsonl_runs_from_content_and_a_file_and_a_run_over_a_datasets_eval_split(
    stack: Stack,
) -> None:
    client = stack.client
    eval_id = create_eval(client)
    calls = len(stack.upstream.requests)
    given = [{"item": QUESTIONS[0], "sample": {"output_text": "Paris"}},
             {"item": QUESTIONS[2], "sample": {"output_text": "Jupiter"}}]  # fmt: skip
    done = until_done(client, eval_id, jsonl_run(client, eval_id, given).id)
    assert done.result_counts.model_dump() == {"total": 2, "passed": 2, "failed": 0, "errored": 0}
    assert done.model is None
    assert len(stack.upstream.requests) == calls  # no model is called for a jsonl run

    # An uploaded file whose second line brings no sample, which the criteria read.
    lines = [{"item": QUESTIONS[0], "sample": {"output_text": "Paris"}}, {"item": QUESTIONS[1]}]
    body = "".join(json.dumps(line) + "\n" for line in lines).encode()
    uploaded = client.files.create(file=("items.jsonl", io.BytesIO(body)), purpose="samples")
    file_run = {"type": "jsonl", "source": {"type": "file_id", "id": uploaded.id}}
    status, param, message = refusal(
        lambda: client.evals.runs.create(eval_id, data_source=file_run)
    )
    assert (status, param) == (422, "data_source.source.id")
    assert f"{uploaded.id} item[1].sample: required" in message

    # A built dataset's eval split: each sample's turns before the last, and the last as the
    # reference. The dataset is built by ingest from two uploaded fine-tune files.
    dataset = built_dataset(stack)
    plain = client.evals.create(
        data_source_config={"type": "custom", "item_schema": {"type": "object"},
                            "include_sample_schema": True},
        testing_criteria=[{"type": "string_check", "name": "exact", "operation": "eq",
                           "input": "{{sample.output_text}}", "reference": "{{item.reference}}"}],
    ).id  # fmt: skip
    run = client.evals.runs.create(plain, data_source={
        "type": "completions", "model": "gpt-4o-mini", "source": {"type": "file_id", "id": dataset},
        "input_messages": {"type": "item_reference", "item_reference": "item.messages"}})  # fmt: skip
    done = until_done(client, plain, run.id)
    assert done.result_counts.model_dump() == {"total": 1, "passed": 1, "failed": 0, "errored": 0}
    [item] = output_items(client, plain, run.id)
    assert item.datasource_item == {
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "reference": "Paris",
    }


@pytest.mark.slow
def test_bad_input_is_refused_naming_the_field(stack: Stack) -> None:
    client = stack.client

    def create(config: dict[str, Any], *criteria: dict[str, Any]) -> Callable[[], object]:
        return lambda: client.evals.create(
            data_source_config=config, testing_criteria=list(criteria)
        )

    label = {"type": "label_model", "name": "j", "model": JUDGE, "labels": ["good", "bad"],
             "passing_labels": ["great"], "input": [{"role": "user", "content": "{{item.answer}}"}]}  # fmt: skip
    refused = {
        "testing_criteria.0.string_check.operation": create(
            CONFIG, dict(CRITERIA[0], operation="contains")),
        "testing_criteria[0].reference": create(CONFIG, dict(CRITERIA[0], reference="{{item.answr}}")),
        "testing_criteria[0].input": create(dict(CONFIG, include_sample_schema=False), *CRITERIA),
        "data_source_config.item_schema": create(dict(CONFIG, item_schema={"type": "strin"}), *CRITERIA),
        "testing_criteria[0].evaluation_metric": create(
            CONFIG, dict(CRITERIA[2], evaluation_metric="cosine")),
        "testing_criteria[0].type": create(
            CONFIG, {"type": "python", "name": "p", "source": "def grade(s, i): return 1"}),
    }  # fmt: skip
    for field, call in refused.items():
        status, param, _ = refusal(call)
        assert (status, param) == (422, field)
    _, _, message = refusal(create(CONFIG, dict(CRITERIA[0], reference="{{item.answr}}")))
    assert "no property 'answr'" in message
    status, param, message = refusal(create(CONFIG, label))
    # The judge's own rule (a passing label among the labels) names the criterion.
    assert (status, param) == (422, "testing_criteria[0]")
    assert "passing_labels" in message

    eval_id = create_eval(client)

    def run(data_source: dict[str, Any], on: str = eval_id) -> Callable[[], object]:
        return lambda: client.evals.runs.create(on, data_source=data_source)

    not_an_item = {"type": "completions", "model": "gpt-4o-mini", "input_messages": template(
        ("user", "{{item.question}}")), "source": inline([{"item": {"question": 3, "answer": "a"}}])}  # fmt: skip
    status, param, message = refusal(run(not_an_item))
    assert (status, param) == (422, "data_source.source.content")
    assert "data_source.source.content[0]/question: 3 is not of type" in message
    no_model = {"type": "completions", "source": inline([{"item": QUESTIONS[0]}]),
                "input_messages": {"type": "item_reference", "item_reference": "item.question"}}  # fmt: skip
    assert refusal(run(no_model))[:2] == (422, "data_source.model")
    one = {"item": QUESTIONS[0], "sample": {"output_text": "x"}}
    too_many = {"type": "jsonl", "source": inline([one] * (MAX_ITEMS + 1))}
    assert refusal(run(too_many))[:2] == (413, "data_source.source.content")
    missing = {"type": "jsonl", "source": {"type": "file_id", "id": "file-nope"}}
    assert refusal(run(missing))[:2] == (404, "data_source.source.id")
    responses = {"type": "responses", "source": {"type": "responses"}}
    assert refusal(run(responses))[:2] == (422, "data_source.type")
    assert refusal(run(too_many, on="eval_nope"))[:2] == (404, "eval_id")


@pytest.mark.slow
def test_another_tenant_sees_nothing_and_a_read_key_changes_nothing(stack: Stack) -> None:
    client, other = stack.client, stack.other
    eval_id = create_eval(client)
    run = jsonl_run(client, eval_id, [{"item": QUESTIONS[0], "sample": {"output_text": "Paris"}}])
    until_done(client, eval_id, run.id)
    [item] = output_items(client, eval_id, run.id)
    for call in (
        lambda: other.evals.retrieve(eval_id),
        lambda: other.evals.update(eval_id, name="theirs"),
        lambda: other.evals.runs.list(eval_id),
        lambda: other.evals.runs.retrieve(run.id, eval_id=eval_id),
        lambda: other.evals.runs.cancel(run.id, eval_id=eval_id),
        lambda: other.evals.runs.output_items.list(run.id, eval_id=eval_id),
        lambda: other.evals.runs.output_items.retrieve(item.id, eval_id=eval_id, run_id=run.id),
    ):
        assert refusal(call)[0] == 404
    assert other.evals.list(limit=100).data == []  # the other tenant made none in this module

    reader = openai.OpenAI(
        base_url=f"{stack.url}/v1", api_key=tenant_key(stack.url, "acme", scope="read"),
        max_retries=0,
    )  # fmt: skip
    with pytest.raises(openai.PermissionDeniedError) as refused:
        reader.evals.update(eval_id, name="renamed by a reader")
    # The gateway refuses it before relaying, in OpenAI's shape as the evaluator would.
    assert refused.value.code == "insufficient_scope"
    assert "needs a key with scope 'write'" in refused.value.message
    with pytest.raises(openai.PermissionDeniedError):
        reader.evals.runs.delete(run.id, eval_id=eval_id)
    assert reader.evals.retrieve(eval_id).name == "capitals"
    assert [i.id for i in reader.evals.runs.output_items.list(run.id, eval_id=eval_id).data] == [
        item.id]  # fmt: skip


@pytest.mark.slow
def test_update_list_delete_and_pages(stack: Stack) -> None:
    # A tenant of its own, so that its list holds exactly this test's evals.
    client = openai.OpenAI(
        base_url=f"{stack.url}/v1", api_key=tenant_key(stack.url, "pages"), max_retries=0
    )
    first, second, third = (create_eval(client) for _ in range(3))
    renamed = client.evals.update(second, name="renamed", metadata={"team": "support"})
    assert (renamed.name, renamed.metadata) == ("renamed", {"team": "support"})
    assert client.evals.retrieve(second).metadata == {"team": "support"}
    page = client.evals.list(limit=2)
    assert ([e.id for e in page.data], page.has_more) == ([first, second], True)
    rest = client.evals.list(limit=2, after=page.data[-1].id)
    assert ([e.id for e in rest.data], rest.has_more) == ([third], False)
    assert [e.id for e in client.evals.list(order="desc", limit=1).data] == [third]
    deleted = client.evals.delete(first)
    assert deleted.to_dict() == {"object": "eval.deleted", "deleted": True, "eval_id": first}
    assert refusal(lambda: client.evals.retrieve(first))[:2] == (404, "eval_id")
    assert refusal(lambda: client.evals.list(after=first))[:2] == (404, "after")


@pytest.mark.slow
def test_a_cancel_stops_a_run_whose_calls_are_in_flight(stack: Stack) -> None:
    client, held = stack.client, "gpt-4o-held"
    eval_id = create_eval(client)
    stack.upstream.held.add(held)
    try:
        run = completions_run(client, eval_id, held, QUESTIONS)
        # Every item's call is at the upstream, waiting: the run is working, not queued.
        assert localstack.wait_until(lambda: len(stack.upstream.sent_to(held)) == 5, 30)
        assert client.evals.runs.cancel(run.id, eval_id=eval_id).status == "canceled"
        assert client.evals.runs.cancel(run.id, eval_id=eval_id).status == "canceled"  # again
    finally:
        stack.upstream.held.discard(held)
    # The held calls are answered now; a later run of the same model is answered and graded,
    # and the canceled run is not.
    later = until_done(client, eval_id, completions_run(client, eval_id, held, QUESTIONS[:1]).id)
    assert later.result_counts.model_dump() == {"total": 1, "passed": 1, "failed": 0, "errored": 0}
    stopped = client.evals.runs.retrieve(run.id, eval_id=eval_id)
    assert stopped.status == "canceled"
    assert stopped.result_counts.model_dump() == {
        "total": 0,
        "passed": 0,
        "failed": 0,
        "errored": 0,
    }
    assert output_items(client, eval_id, run.id) == []
    assert [r.id for r in client.evals.runs.list(eval_id, status="canceled").data] == [run.id]

    deleted = client.evals.runs.delete(run.id, eval_id=eval_id)
    assert deleted.to_dict() == {"object": "eval.run.deleted", "deleted": True, "run_id": run.id}
    assert refusal(lambda: client.evals.runs.retrieve(run.id, eval_id=eval_id))[:2] == (
        404, "run_id")  # fmt: skip


@pytest.mark.slow
def test_an_unknown_model_fails_the_run_with_the_gateways_message(stack: Stack) -> None:
    client = stack.client
    eval_id = create_eval(client)
    done = until_done(
        client, eval_id, completions_run(client, eval_id, "no-such-model", QUESTIONS).id
    )
    assert done.status == "failed"
    assert done.error.code == "model_not_found"
    assert "The model `no-such-model` does not exist" in done.error.message


@pytest.mark.slow
def test_score_model_and_label_model_are_graded_by_the_judge(stack: Stack) -> None:
    client = stack.client
    eval_id = judged_eval(client)
    given = [{"item": QUESTIONS[0], "sample": {"output_text": "Paris"}},
             {"item": QUESTIONS[2], "sample": {"output_text": "Saturn"}},
             {"item": QUESTIONS[1], "sample": {"output_text": "garbled"}}]  # fmt: skip
    done = until_done(client, eval_id, jsonl_run(client, eval_id, given).id)
    assert done.status == "completed", done
    assert done.result_counts.model_dump() == {"total": 3, "passed": 1, "failed": 1, "errored": 1}
    assert done.to_dict()["judge_errors"] == 1  # the errored item is the judge's
    paris, saturn, garbled = output_items(client, eval_id, done.id)
    assert [(r.type, r.score, r.passed) for r in paris.results] == [
        ("label-model-grader", 1.0, True), ("score-model-grader", 0.9, True)]  # fmt: skip
    assert paris.results[0].sample["label"] == "correct"
    assert paris.results[1].sample["assessment"] == "close"
    assert [(r.score, r.passed) for r in saturn.results] == [(0.0, False), (0.4, False)]
    assert garbled.status == "error"
    assert garbled.results[0].to_dict()["error"].startswith("judge_error: unreadable twice")
    # The judge was asked through the gateway: the item's question, rendered, in its prompt.
    assert any("Question: What is the capital of France?" in b["messages"][0]["content"]
               for b in stack.upstream.sent_to(JUDGE))  # fmt: skip

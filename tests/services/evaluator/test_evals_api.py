"""The Evals API's routes in one process: the evaluator's routers on a migrated SQLite file, a
tenant's keys, runs executed by the real RunExecutor on the app's event loop, the model and
ingest answered by httpx mock transports. Results are checked exactly; bad input is refused
naming the field; another tenant sees nothing; a cancel stops a run; a restart finishes what
it can without the caller's key and says why it stopped.

The same API through the gateway with the official SDK and real processes: test_evals_sdk.py.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from services.evaluator import api as job_api
from services.evaluator import judge
from services.evaluator.evals import api, sources, store
from services.evaluator.evals.runs import RunExecutor
from services.evaluator.evals.serving import Evals
from services.evaluator.models import EvalsOutputItemRow, EvalsRunRow
from shared import auth
from shared.db import make_engine, session_scope

ITEM_SCHEMA = {
    "type": "object",
    "properties": {"question": {"type": "string"}, "answer": {"type": "string"}},
    "required": ["question", "answer"],
}
CRITERIA = [
    {"type": "string_check", "name": "exact", "input": "{{sample.output_text}}",
     "reference": "{{item.answer}}", "operation": "eq"},
    {"type": "text_similarity", "name": "close", "input": "{{sample.output_text}}",
     "reference": "{{item.answer}}", "evaluation_metric": "fuzzy_match", "pass_threshold": 0.8},
]  # fmt: skip
ANSWERS = {"capital of France?": "Paris", "2 + 2?": "4", "largest planet?": "Jupiter!"}
ITEMS = [
    {"question": "capital of France?", "answer": "Paris"},
    {"question": "2 + 2?", "answer": "5"},
    {"question": "largest planet?", "answer": "Jupiter"},
    {"question": "REFUSE this one", "answer": "x"},
]


@dataclass
class FakeModel:
    """A chat-completions endpoint: known questions answered, `REFUSE` a 400, else `?`."""

    delay_s: float = 0.0
    seen: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.seen.append((request.headers["authorization"], body))
        await asyncio.sleep(self.delay_s)
        question = body["messages"][-1]["content"]
        if "REFUSE" in question:
            error = {"message": "prompt refused", "type": "invalid_request_error"}
            return httpx.Response(400, json={"error": error})
        if body["model"] == "no-such-model":
            return httpx.Response(404, json={"error": {"message": "model not found"}})
        text = next((a for q, a in ANSWERS.items() if q in question), "?")
        return httpx.Response(200, json=_completion(body["model"], text))


def _completion(model: str, text: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": model,
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": text}}],
        "usage": {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9},
    }  # fmt: skip


def _ingest(request: httpx.Request) -> httpx.Response:
    """Ingest's file content and dataset export, for the key `tl_` callers send."""
    if not request.headers.get("authorization", "").startswith("Bearer tl_"):
        return httpx.Response(401, json={"detail": "no key"})
    path = request.url.path
    if path == "/v1/files/file-abc/content":
        lines = [{"item": ITEMS[0], "sample": {"output_text": "Paris"}}, {"item": ITEMS[1]}]
        return httpx.Response(200, content="\n".join(json.dumps(x) for x in lines).encode())
    if path == "/v1/datasets/ds_1/export":
        assert request.url.params["split"] == "eval"
        sample = {"messages": [{"role": "user", "content": "capital of France?"},
                               {"role": "assistant", "content": "Paris"}]}  # fmt: skip
        return httpx.Response(200, content=json.dumps(sample).encode())
    return httpx.Response(404, json={"detail": f"{path.rsplit('/', 2)[-2]!r} not found"})


@dataclass
class Harness:
    client: TestClient
    mine: dict[str, str]
    theirs: dict[str, str]
    reader: dict[str, str]
    model: FakeModel
    engine: Engine

    def post(self, path: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
        return self.client.post(f"/v1{path}", json=body, headers=headers or self.mine)

    def get(self, path: str, headers: dict[str, str] | None = None, **params: Any) -> Any:
        return self.client.get(f"/v1{path}", params=params, headers=headers or self.mine)

    def until_done(self, eval_id: str, run_id: str) -> dict[str, Any]:
        deadline = time.monotonic() + 20
        while True:
            run = self.get(f"/evals/{eval_id}/runs/{run_id}").json()
            if run["status"] not in ("queued", "in_progress"):
                return dict(run)
            assert time.monotonic() < deadline, run
            time.sleep(0.05)

    def eval(self, **changes: Any) -> str:
        body = {"name": "qa", "data_source_config": {"type": "custom", "item_schema": ITEM_SCHEMA,
                "include_sample_schema": True}, "testing_criteria": CRITERIA} | changes  # fmt: skip
        created = self.post("/evals", body)
        assert created.status_code == 200, created.text
        return str(created.json()["id"])


def _keys(engine: Engine) -> tuple[str, str, str]:
    with session_scope(engine) as session:
        for tenant in ("acme", "globex"):
            auth.ensure_tenant(session, tenant_id=tenant)
        _, mine = auth.issue_api_key(session, tenant_id="acme", name="t", scope="write")
        _, reader = auth.issue_api_key(session, tenant_id="acme", name="r", scope="read")
        _, theirs = auth.issue_api_key(session, tenant_id="globex", name="t", scope="write")
    return mine, reader, theirs


def _openai(key: str, answer: Any) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url="http://gateway/v1", api_key=key, max_retries=0,
        http_client=httpx.AsyncClient(transport=httpx.MockTransport(answer)),
    )  # fmt: skip


def _judge(key: str) -> judge.JudgeClient:
    """The evaluator's judge client, its calls answered by `_verdict`."""
    client = judge.JudgeClient(base_url="http://gateway/v1", api_key=key, purpose=None)
    client._client = _openai(key, _verdict)  # the transport, swapped
    return client


def _verdict(request: httpx.Request) -> httpx.Response:
    """A judge: Paris is correct (0.9), Jupiter a 0.4, a garbled answer garbled twice."""
    prompt = json.dumps(json.loads(request.content)["messages"])
    if "garbled" in prompt:
        reply = "I think it is fine"
    elif "label" in prompt:
        reply = json.dumps({"label": "correct" if "Paris" in prompt else "incorrect",
                            "assessment": "checked against the reference"})  # fmt: skip
    else:
        reply = json.dumps({"score": 0.9 if "Paris" in prompt else 0.4, "assessment": "close"})
    return httpx.Response(200, json=_completion("judge", reply))


def _app(engine: Engine, model: FakeModel) -> tuple[FastAPI, RunExecutor]:
    executor = RunExecutor(
        engine, gateway_url="http://gateway", concurrency=2, runs_at_once=2, timeout_s=5,
        client_factory=lambda key, run_id: _openai(key, model), judge_factory=_judge,
    )  # fmt: skip
    reader = sources.IngestReader(
        httpx.AsyncClient(transport=httpx.MockTransport(_ingest)), "http://ingest", max_bytes=10_000
    )
    app = FastAPI()
    app.state.db_engine = engine
    app.state.evals = Evals(engine, executor, reader, max_items=5)
    app.include_router(job_api.router)
    app.include_router(api.router)
    api.add_error_handlers(app)
    return app, executor


@pytest.fixture
def harness(tmp_path: Path, sqlite_template: Path) -> Iterator[Harness]:
    shutil.copyfile(sqlite_template, tmp_path / "tuneloop.db")
    engine = make_engine(f"sqlite:///{tmp_path / 'tuneloop.db'}")
    mine, reader, theirs = _keys(engine)
    model = FakeModel()
    app, _ = _app(engine, model)
    bearer: Callable[[str], dict[str, str]] = lambda key: {"Authorization": f"Bearer {key}"}  # noqa: E731
    with TestClient(app) as client:
        yield Harness(client, bearer(mine), bearer(theirs), bearer(reader), model, engine)
    engine.dispose()


def _results(harness: Harness, eval_id: str, run_id: str) -> list[dict[str, Any]]:
    page = harness.get(f"/evals/{eval_id}/runs/{run_id}/output_items", limit=100).json()
    return list(page["data"])


def test_a_completions_run_is_answered_graded_and_counted_exactly(harness: Harness) -> None:
    eval_id = harness.eval()
    fetched = harness.get(f"/evals/{eval_id}").json()
    assert fetched["object"] == "eval"
    assert fetched["data_source_config"]["schema"]["properties"]["item"] == ITEM_SCHEMA
    run = harness.post(f"/evals/{eval_id}/runs", {"name": "gpt", "data_source": {
        "type": "completions", "model": "gpt-4o-mini",
        "source": {"type": "file_content", "content": [{"item": i} for i in ITEMS]},
        "input_messages": {"type": "template", "template": [
            {"role": "developer", "content": "Answer in one word."},
            {"role": "user", "content": "Q: {{item.question}}"}]},
        "sampling_params": {"temperature": 0, "max_completion_tokens": 16, "seed": 7}}})  # fmt: skip
    assert run.status_code == 200, run.text
    assert run.json()["status"] == "queued"
    done = harness.until_done(eval_id, run.json()["id"])
    assert done["status"] == "completed", done
    assert done["result_counts"] == {"total": 4, "passed": 1, "failed": 2, "errored": 1}
    assert done["per_testing_criteria_results"] == [
        {"testing_criteria": "exact", "passed": 1, "failed": 2},
        {"testing_criteria": "close", "passed": 2, "failed": 1},
    ]
    assert done["per_model_usage"] == [{
        "model_name": "gpt-4o-mini", "invocation_count": 4, "prompt_tokens": 21,
        "completion_tokens": 6, "total_tokens": 27, "cached_tokens": 0}]  # fmt: skip
    sent = harness.model.seen[0][1]
    assert sent["messages"][0] == {"role": "system", "content": "Answer in one word."}
    assert sent["max_completion_tokens"] == 16
    assert sent["seed"] == 7
    assert all(key == harness.mine["Authorization"] for key, _ in harness.model.seen)
    items = _results(harness, eval_id, done["id"])
    assert [i["status"] for i in items] == ["pass", "fail", "fail", "error"]
    paris, four, jupiter, refused = items
    assert paris["sample"]["output"] == [{"role": "assistant", "content": "Paris"}]
    assert paris["sample"]["input"][1] == {"role": "user", "content": "Q: capital of France?"}
    assert [(r["name"], r["score"], r["passed"]) for r in four["results"]] == [
        ("exact", 0.0, False), ("close", 0.0, False)]  # fmt: skip
    assert jupiter["results"][1]["score"] == pytest.approx(14 / 15)  # "Jupiter!" vs "Jupiter"
    assert jupiter["results"][1]["passed"] is True
    assert refused["sample"]["error"] == {"code": "400", "message": "prompt refused"}
    assert "prompt refused" in refused["results"][0]["error"]
    assert refused["datasource_item"] == ITEMS[3]
    one = harness.get(f"/evals/{eval_id}/runs/{done['id']}/output_items/{paris['id']}").json()
    assert one == paris
    failing = harness.get(f"/evals/{eval_id}/runs/{done['id']}/output_items", status="fail")
    assert [i["datasource_item_id"] for i in failing.json()["data"]] == [1, 2]


def test_jsonl_runs_from_content_a_file_and_a_dataset(harness: Harness) -> None:
    eval_id = harness.eval()
    content = [{"item": ITEMS[0], "sample": {"output_text": "Paris"}},
               {"item": ITEMS[2], "sample": {"output_text": "Jupiter"}}]  # fmt: skip
    run = harness.post(f"/evals/{eval_id}/runs", {"data_source": {
        "type": "jsonl", "source": {"type": "file_content", "content": content}}}).json()  # fmt: skip
    done = harness.until_done(eval_id, run["id"])
    assert done["result_counts"] == {"total": 2, "passed": 2, "failed": 0, "errored": 0}
    assert done["model"] is None
    assert harness.model.seen == []  # no model is called for a jsonl run
    # A file: the second line brings no sample, which the criteria need.
    from_file = harness.post(f"/evals/{eval_id}/runs", {"data_source": {
        "type": "jsonl", "source": {"type": "file_id", "id": "file-abc"}}})  # fmt: skip
    assert from_file.status_code == 422
    assert "file-abc item[1].sample: required" in from_file.json()["error"]["message"]
    # A dataset's eval split: its turns before the last, and the last as the reference.
    plain = harness.eval(
        data_source_config={"type": "custom", "item_schema": {"type": "object"},
                            "include_sample_schema": True},
        testing_criteria=[{"type": "string_check", "name": "exact", "operation": "eq",
                           "input": "{{sample.output_text}}", "reference": "{{item.reference}}"}],
    )  # fmt: skip
    run = harness.post(f"/evals/{plain}/runs", {"data_source": {
        "type": "completions", "model": "gpt-4o-mini", "source": {"type": "file_id", "id": "ds_1"},
        "input_messages": {"type": "item_reference", "item_reference": "item.messages"}}})  # fmt: skip
    assert run.status_code == 200, run.text
    done = harness.until_done(plain, run.json()["id"])
    assert done["result_counts"]["passed"] == 1
    [item] = _results(harness, plain, done["id"])
    assert item["datasource_item"] == {
        "messages": [{"role": "user", "content": "capital of France?"}], "reference": "Paris"}  # fmt: skip


def _refusal(response: Any) -> tuple[int, str, str]:
    body = response.json()
    return response.status_code, body["error"]["param"], body["error"]["message"]


def test_bad_input_is_refused_naming_the_field(harness: Harness) -> None:
    config = {"type": "custom", "item_schema": ITEM_SCHEMA, "include_sample_schema": True}
    bad_op = dict(CRITERIA[0], operation="contains")
    status, param, _ = _refusal(harness.post("/evals", {"data_source_config": config,
                                                        "testing_criteria": [bad_op]}))  # fmt: skip
    assert (status, param) == (422, "testing_criteria.0.string_check.operation")
    typo = dict(CRITERIA[0], reference="{{item.answr}}")
    status, param, message = _refusal(
        harness.post("/evals", {"data_source_config": config, "testing_criteria": [typo]}))  # fmt: skip
    assert (status, param) == (422, "testing_criteria[0].reference")
    assert "no property 'answr'" in message
    no_sample = dict(config, include_sample_schema=False)
    status, param, _ = _refusal(
        harness.post("/evals", {"data_source_config": no_sample, "testing_criteria": CRITERIA}))  # fmt: skip
    assert (status, param) == (422, "testing_criteria[0].input")
    not_a_schema = dict(config, item_schema={"type": "strin"})
    status, param, _ = _refusal(
        harness.post("/evals", {"data_source_config": not_a_schema, "testing_criteria": CRITERIA}))  # fmt: skip
    assert (status, param) == (422, "data_source_config.item_schema")
    cosine = dict(CRITERIA[1], evaluation_metric="cosine")
    status, param, _ = _refusal(
        harness.post("/evals", {"data_source_config": config, "testing_criteria": [cosine]}))  # fmt: skip
    assert (status, param) == (422, "testing_criteria[0].evaluation_metric")
    python = {"type": "python", "name": "p", "source": "def grade(s, i): return 1"}
    status, param, _ = _refusal(
        harness.post("/evals", {"data_source_config": config, "testing_criteria": [python]}))  # fmt: skip
    assert (status, param) == (422, "testing_criteria[0].type")
    label = {"type": "label_model", "name": "j", "model": "gpt-4o", "labels": ["good", "bad"],
             "passing_labels": ["great"], "input": [{"role": "user", "content": "{{item.answer}}"}]}  # fmt: skip
    status, param, message = _refusal(
        harness.post("/evals", {"data_source_config": config, "testing_criteria": [label]}))  # fmt: skip
    assert status == 422
    assert "passing_labels" in message

    eval_id = harness.eval()
    source = {"type": "file_content", "content": [{"item": {"question": 3, "answer": "a"}}]}
    status, param, message = _refusal(harness.post(f"/evals/{eval_id}/runs", {"data_source": {
        "type": "completions", "model": "m", "source": source,
        "input_messages": {"type": "template", "template": [
            {"role": "user", "content": "{{item.question}}"}]}}}))  # fmt: skip
    assert (status, param) == (422, "data_source.source.content")
    assert "data_source.source.content[0]/question: 3 is not of type" in message
    no_model = {"type": "completions", "source": {"type": "file_content", "content": [
        {"item": ITEMS[0]}]}, "input_messages": {"type": "item_reference", "item_reference": "item.question"}}  # fmt: skip
    status, param, _ = _refusal(harness.post(f"/evals/{eval_id}/runs", {"data_source": no_model}))
    assert (status, param) == (422, "data_source.model")
    too_many = {"type": "jsonl", "source": {"type": "file_content", "content": [
        {"item": ITEMS[0], "sample": {"output_text": "x"}}] * 6}}  # fmt: skip
    status, param, _ = _refusal(harness.post(f"/evals/{eval_id}/runs", {"data_source": too_many}))
    assert (status, param) == (413, "data_source.source.content")
    missing = {"type": "jsonl", "source": {"type": "file_id", "id": "file-nope"}}
    status, param, message = _refusal(
        harness.post(f"/evals/{eval_id}/runs", {"data_source": missing})
    )
    assert (status, param) == (404, "data_source.source.id")
    responses = {"type": "responses", "source": {"type": "responses"}}
    status, param, _ = _refusal(harness.post(f"/evals/{eval_id}/runs", {"data_source": responses}))
    assert (status, param) == (422, "data_source.type")
    status, param, _ = _refusal(harness.post("/evals/eval_nope/runs", {"data_source": too_many}))
    assert (status, param) == (404, "eval_id")


def test_another_tenant_sees_nothing_and_a_read_key_changes_nothing(harness: Harness) -> None:
    eval_id = harness.eval()
    content = [{"item": ITEMS[0], "sample": {"output_text": "Paris"}}]
    run = harness.post(f"/evals/{eval_id}/runs", {"data_source": {
        "type": "jsonl", "source": {"type": "file_content", "content": content}}}).json()  # fmt: skip
    done = harness.until_done(eval_id, run["id"])
    [item] = _results(harness, eval_id, done["id"])
    theirs = harness.theirs
    for path in (f"/evals/{eval_id}", f"/evals/{eval_id}/runs", f"/evals/{eval_id}/runs/{run['id']}",
                 f"/evals/{eval_id}/runs/{run['id']}/output_items",
                 f"/evals/{eval_id}/runs/{run['id']}/output_items/{item['id']}"):  # fmt: skip
        assert harness.get(path, headers=theirs).status_code == 404, path
    assert harness.get("/evals", headers=theirs).json()["data"] == []
    assert harness.post(f"/evals/{eval_id}", {"name": "x"}, headers=theirs).status_code == 404
    assert harness.client.delete(f"/v1/evals/{eval_id}", headers=theirs).status_code == 404
    refused = harness.post(f"/evals/{eval_id}", {"name": "x"}, headers=harness.reader)
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "insufficient_scope"
    assert harness.get(f"/evals/{eval_id}", headers=harness.reader).status_code == 200
    assert harness.get("/evals").json()["data"][0]["id"] == eval_id


def test_update_list_delete_and_pages(harness: Harness) -> None:
    first, second, third = harness.eval(), harness.eval(), harness.eval()
    renamed = harness.post(f"/evals/{second}", {"name": "renamed", "metadata": {"team": "qa"}})
    assert renamed.json()["name"] == "renamed"
    assert renamed.json()["metadata"] == {"team": "qa"}
    page = harness.get("/evals", limit=2).json()
    assert [e["id"] for e in page["data"]] == [first, second]
    assert page["has_more"] is True
    rest = harness.get("/evals", limit=2, after=page["last_id"]).json()
    assert [e["id"] for e in rest["data"]] == [third]
    assert rest["has_more"] is False
    newest = harness.get("/evals", order="desc", limit=1).json()["data"][0]["id"]
    assert newest == third
    deleted = harness.client.delete(f"/v1/evals/{first}", headers=harness.mine).json()
    assert deleted == {"object": "eval.deleted", "deleted": True, "eval_id": first}
    assert harness.get(f"/evals/{first}").status_code == 404
    bad_after = harness.get("/evals", after="eval_gone")
    assert bad_after.status_code == 404


def test_a_run_is_canceled_and_deleted(harness: Harness) -> None:
    harness.model.delay_s = 5
    eval_id = harness.eval()
    run = harness.post(f"/evals/{eval_id}/runs", {"data_source": {
        "type": "completions", "model": "m",
        "source": {"type": "file_content", "content": [{"item": i} for i in ITEMS]},
        "input_messages": {"type": "template", "template": [
            {"role": "user", "content": "{{item.question}}"}]}}}).json()  # fmt: skip
    canceled = harness.post(f"/evals/{eval_id}/runs/{run['id']}/cancel", {})
    assert canceled.status_code == 200, canceled.text
    assert canceled.json()["status"] == "canceled"
    again = harness.post(f"/evals/{eval_id}/runs/{run['id']}/cancel", {})
    assert again.json()["status"] == "canceled"
    listed = harness.get(f"/evals/{eval_id}/runs", status="canceled").json()["data"]
    assert [r["id"] for r in listed] == [run["id"]]
    deleted = harness.client.delete(f"/v1/evals/{eval_id}/runs/{run['id']}", headers=harness.mine)
    assert deleted.json() == {"object": "eval.run.deleted", "deleted": True, "run_id": run["id"]}
    assert harness.get(f"/evals/{eval_id}/runs/{run['id']}").status_code == 404


def test_an_unknown_model_fails_the_run_with_the_gateways_message(harness: Harness) -> None:
    eval_id = harness.eval()
    run = harness.post(f"/evals/{eval_id}/runs", {"data_source": {
        "type": "completions", "model": "no-such-model",
        "source": {"type": "file_content", "content": [{"item": ITEMS[0]}]},
        "input_messages": {"type": "template", "template": [
            {"role": "user", "content": "{{item.question}}"}]}}}).json()  # fmt: skip
    done = harness.until_done(eval_id, run["id"])
    assert done["status"] == "failed"
    assert done["error"]["code"] == "model_not_found"
    assert "model not found" in done["error"]["message"]


async def test_a_restart_grades_the_answers_it_has_and_fails_the_rest(
    tmp_path: Path, sqlite_template: Path
) -> None:
    shutil.copyfile(sqlite_template, tmp_path / "tuneloop.db")
    engine = make_engine(f"sqlite:///{tmp_path / 'tuneloop.db'}")
    model = FakeModel()
    app, executor = _app(engine, model)
    evals: Evals = app.state.evals
    created = await evals.create_eval("acme", api.protocol.EvalCreate.model_validate({
        "data_source_config": {"type": "custom", "item_schema": ITEM_SCHEMA,
                               "include_sample_schema": True},
        "testing_criteria": CRITERIA}))  # fmt: skip
    data_source = {"type": "completions", "model": "m",
                   "source": {"type": "file_content", "content": [{"item": i} for i in ITEMS[:2]]},
                   "input_messages": {"type": "item_reference", "item_reference": "item.question"}}  # fmt: skip
    # What a process killed mid-run leaves: in progress, one item answered, one not.
    answered = {"output": [{"role": "assistant", "content": "Paris"}], "error": None}
    store.add(
        engine,
        EvalsRunRow(id="evalrun_x", eval_id=created.id, tenant="acme", name="r",
                    meta=store.dumps(None), data_source=store.dumps(data_source), model="m",
                    status="in_progress", items=2, per_criteria=store.dumps({}),
                    usage=store.dumps({})),
        EvalsOutputItemRow(run_id="evalrun_x", position=0, id="outputitem_a",
                           item=store.dumps(ITEMS[0]), sample=store.dumps(answered), status="pending"),
        EvalsOutputItemRow(run_id="evalrun_x", position=1, id="outputitem_b",
                           item=store.dumps(ITEMS[1]), status="pending"),
    )  # fmt: skip
    await executor.start()
    await executor.wait("evalrun_x")
    run = await evals.get_run("acme", created.id, "evalrun_x")
    assert run.status == "failed"
    assert run.error is not None
    assert run.error.code == "interrupted"
    assert "1 of 2 items" in run.error.message
    assert run.result_counts.model_dump() == {"total": 1, "passed": 1, "failed": 0, "errored": 0}
    assert model.seen == []
    await evals.reader.client.aclose()
    engine.dispose()


def test_score_model_and_label_model_are_graded_by_the_judge(harness: Harness) -> None:
    messages = [{"role": "user", "content": "Question: {{item.question}} Reference: "
                 "{{item.answer}} Answer: {{sample.output_text}}"}]  # fmt: skip
    eval_id = harness.eval(testing_criteria=[
        {"type": "label_model", "name": "right", "model": "gpt-4o", "input": messages,
         "labels": ["correct", "incorrect"], "passing_labels": ["correct"]},
        {"type": "score_model", "name": "quality", "model": "gpt-4o", "input": messages,
         "range": [0, 1], "pass_threshold": 0.5},
    ])  # fmt: skip
    content = [{"item": ITEMS[0], "sample": {"output_text": "Paris"}},
               {"item": ITEMS[2], "sample": {"output_text": "Saturn"}},
               {"item": ITEMS[1], "sample": {"output_text": "garbled"}}]  # fmt: skip
    run = harness.post(f"/evals/{eval_id}/runs", {"data_source": {
        "type": "jsonl", "source": {"type": "file_content", "content": content}}}).json()  # fmt: skip
    done = harness.until_done(eval_id, run["id"])
    assert done["status"] == "completed", done
    assert done["result_counts"] == {"total": 3, "passed": 1, "failed": 1, "errored": 1}
    paris, saturn, garbled = _results(harness, eval_id, done["id"])
    assert [(r["type"], r["score"], r["passed"]) for r in paris["results"]] == [
        ("label-model-grader", 1.0, True), ("score-model-grader", 0.9, True)]  # fmt: skip
    assert paris["results"][0]["sample"]["label"] == "correct"
    assert paris["results"][1]["sample"]["assessment"] == "close"
    assert [(r["score"], r["passed"]) for r in saturn["results"]] == [(0.0, False), (0.4, False)]
    assert garbled["status"] == "error"
    assert garbled["results"][0]["error"].startswith("judge_error: unreadable twice")

"""An Evals run goes on after a restart of the evaluator process, on real processes
(evals_stack.py) driven through the gateway with the official `openai` SDK: the run whose call was
in flight makes it again and completes, queued runs (one graded by a judge) complete, a run whose
caller's key was revoked meanwhile stops `unauthorized`, each resumed run's own key (an internal
key of its tenant) ends revoked, and no caller's key is ever in the database."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from shared.dev import localstack
from shared.settings import Settings
from tests.plugins.infra import RunningProcess
from tests.services.evaluator.evals_calls import (
    JUDGE,
    auth,
    jsonl_run,
    judged_eval,
    output_items,
    verdict,
)
from tests.services.evaluator.evals_stack import (
    QUESTIONS,
    Stack,
    completions_run,
    create_eval,
    running,
    tenant_key,
    until_done,
)

CHUNK = 32  # runs.py stores a run's items max(32, 4 x EVALS_CONCURRENCY) at a time


@pytest.fixture(scope="module")
def stack(
    nats_server: RunningProcess,
    s3_server: RunningProcess,
    stack_settings: Settings,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Stack]:
    with running(tmp_path_factory.mktemp("evals-restart"), stack_settings) as started:
        started.upstream.judges[JUDGE] = verdict
        yield started


@pytest.mark.slow
def test_a_restart_resumes_each_run_without_the_callers_key_ever_stored(stack: Stack) -> None:
    client, model, busy = stack.client, "gpt-4o-restarted", "gpt-4o-busy"
    eval_id, judged = create_eval(client), judged_eval(client)
    late = {"question": "LATE: what is the capital of France?", "answer": "Paris"}
    admin = auth(tenant_key(stack.url, "acme", scope="admin"))
    # Another key of the tenant, revoked while the evaluator is down: its run does not go on.
    revoked = tenant_key(stack.url, "acme")
    by_revoked = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=revoked, max_retries=0)
    # One chunk answered and graded (France, 2 + 2, the planet and tac, eight times), and one
    # item after it whose call the upstream holds; a second run fills the other slot
    # (EVALS_RUNS_AT_ONCE, 2), so the other runs wait, queued.
    answered = [QUESTIONS[i % 4] for i in range(CHUNK)]
    stack.upstream.held |= {"LATE", busy}
    try:
        interrupted = completions_run(client, eval_id, model, [*answered, late])
        waiting = completions_run(client, eval_id, busy, QUESTIONS[:2])
        given = jsonl_run(
            client, eval_id, [{"item": QUESTIONS[0], "sample": {"output_text": "Paris"}}]
        )
        # An answer no other test gives: the judge's verdict on it is in no cache.
        fresh = {"item": QUESTIONS[0], "sample": {"output_text": "Paris, after a restart"}}
        asks_the_judge = jsonl_run(client, judged, [fresh])
        orphaned = completions_run(by_revoked, eval_id, busy, QUESTIONS[:1])

        def mid_run() -> bool:
            graded = output_items(client, eval_id, interrupted.id)
            late_sent = any(
                "LATE" in b["messages"][-1]["content"] for b in stack.upstream.sent_to(model)
            )
            return len(graded) == CHUNK and late_sent and len(stack.upstream.sent_to(busy)) == 2

        assert localstack.wait_until(mid_run, 60, interval_s=0.2)
        for queued, on in ((given, eval_id), (asks_the_judge, judged), (orphaned, eval_id)):
            assert client.evals.runs.retrieve(queued.id, eval_id=on).status == "queued"
        stack.evaluator.stop()
        keys = httpx.get(f"{stack.url}/v1/keys", headers=admin).json()["data"]
        [revoked_id] = [k["id"] for k in keys if revoked.startswith(f"tl_{k['prefix']}_")]
        assert httpx.delete(f"{stack.url}/v1/keys/{revoked_id}", headers=admin).status_code == 200
        judge_calls, late_calls = (
            len(stack.upstream.sent_to(JUDGE)),
            len(stack.upstream.sent_to(model)),
        )
        stack.evaluator.start(timeout_s=90)
    finally:
        stack.upstream.held -= {"LATE", busy}

    # The interrupted run goes on with the item left: its call made again, graded, counted.
    first = until_done(client, eval_id, interrupted.id)
    assert (first.status, first.error) == ("completed", None)
    assert first.result_counts.model_dump() == {
        "total": CHUNK + 1, "passed": CHUNK // 4 + 1, "failed": CHUNK * 3 // 4, "errored": 0}  # fmt: skip
    assert len(stack.upstream.sent_to(model)) == late_calls + 1
    assert output_items(client, eval_id, interrupted.id)[-1].sample.output[0].content == "Paris"
    assert first.per_model_usage[0].invocation_count == CHUNK + 1
    second = until_done(client, eval_id, waiting.id)
    assert second.result_counts.model_dump() == {
        "total": 2, "passed": 1, "failed": 1, "errored": 0}  # fmt: skip
    assert until_done(client, eval_id, given.id).status == "completed"
    # The judge is a model called with the run's key too: asked after the restart, it grades.
    judged_run = until_done(client, judged, asks_the_judge.id)
    assert judged_run.result_counts.model_dump() == {
        "total": 1, "passed": 1, "failed": 0, "errored": 0}  # fmt: skip
    assert len(stack.upstream.sent_to(JUDGE)) == judge_calls + 2  # label and score
    stopped = until_done(client, eval_id, orphaned.id)
    assert (stopped.status, stopped.error.code) == ("failed", "unauthorized")
    assert f"the API key that started this run ({revoked.split('_')[1]}) was revoked" in (
        stopped.error.message
    )

    # Each resumed run had a key of its own, internal, revoked once its run ended.
    def minted() -> list[dict[str, Any]]:
        listed = httpx.get(f"{stack.url}/v1/keys", headers=admin).json()["data"]
        return [k for k in listed if k["name"].startswith("evaluator: resumes eval run")]

    assert localstack.wait_until(lambda: all(k["revoked_at"] for k in minted()), 10)
    assert sorted(k["name"].rsplit(" ", 1)[1] for k in minted()) == sorted(
        [interrupted.id, waiting.id, asks_the_judge.id])  # fmt: skip
    assert {k["scope"] for k in minted()} == {"internal"}
    # Neither caller's key is anywhere in the database (its file and its write-ahead log).
    stored = b"".join(
        path.read_bytes() for path in stack.database.parent.glob(f"{stack.database.name}*")
    )
    assert b"evaluator_eval_runs" in stored  # the right file
    assert stack.key.encode() not in stored
    assert revoked.encode() not in stored

"""Versions side by side (GET /v1/evals/{eval_id}/compare) driven through the gateway with the
official `openai` SDK on real processes (tests/services/evaluator/evals_stack.py): two models
answer the same items on the fake upstream, each better on some, and the comparison lists the
candidate's regressions first with exact deltas and each call's latency; runs that cannot be
compared are refused naming why."""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from services.evaluator.evals.compare import Comparison
from shared.settings import Settings
from tests.plugins.infra import RunningProcess
from tests.services.evaluator.evals_stack import (
    QUESTIONS,
    Stack,
    completions_run,
    create_eval,
    running,
    until_done,
)

BASE, CANDIDATE, HELD = "gpt-4o-mini", "gpt-4.1-mini", "gpt-4.1-nano"
SKY = {"question": "What colour is the sky?", "answer": "blue"}
GRASS = {"question": "What colour is grass?", "answer": "green"}
ITEMS = [*QUESTIONS, SKY, GRASS]
# The candidate: worse on France, better on 2 + 2 and on the case of "tac", the same on the
# planet, and it refuses the sky (the base says "I do not know.": a failure, not an error);
# the base refuses grass, which the candidate gets right.
CANDIDATE_ANSWERS: dict[str, str | None] = {
    "capital of France": "Lyon",
    "2 + 2": "5",
    "cat backwards": "tac",
    "colour is the sky": None,
    "colour is grass": "green",
}
BASE_ANSWERS: dict[str, str | None] = {"colour is grass": None}  # the base refuses grass
PLANET = (0 + 1 + 14 / 37 + 1 / 3) / 4  # base and candidate alike (see test_evals_sdk.py)


@pytest.fixture(scope="module")
def stack(
    nats_server: RunningProcess,
    s3_server: RunningProcess,
    stack_settings: Settings,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Stack]:
    with running(tmp_path_factory.mktemp("evals-compare"), stack_settings) as started:
        started.upstream.answers |= {BASE: BASE_ANSWERS, CANDIDATE: CANDIDATE_ANSWERS}
        yield started


def compare(client: openai.OpenAI, eval_id: str, **params: Any) -> Comparison:
    found = client.get(f"/evals/{eval_id}/compare", cast_to=object, options={"params": params})
    return Comparison.model_validate(found)


def _jsonl(client: openai.OpenAI, eval_id: str, rows: list[dict[str, Any]]) -> Any:
    source = {"type": "file_content", "content": rows}
    return client.evals.runs.create(eval_id, data_source={"type": "jsonl", "source": source})


@pytest.mark.slow
def test_two_models_side_by_side_regressions_first(stack: Stack) -> None:
    client = stack.client
    eval_id = create_eval(client)
    base = completions_run(client, eval_id, BASE, ITEMS)
    candidate = completions_run(client, eval_id, CANDIDATE, ITEMS)
    assert until_done(client, eval_id, base.id).status == "completed"
    assert until_done(client, eval_id, candidate.id).status == "completed"

    # Each output item of a completions run carries its call's wall time.
    listed = client.evals.runs.output_items.list(candidate.id, eval_id=eval_id, limit=10).data
    assert [i.datasource_item_id for i in listed] == [0, 1, 2, 3, 4, 5, 6]
    assert all(i.sample.to_dict()["latency_ms"] > 0 for i in listed)

    found = compare(client, eval_id, base=base.id, candidate=candidate.id)
    order = [(i.datasource_item_id, i.change) for i in found.data]
    # The errored: the candidate's own error (sky), the base's (grass), both's (refused).
    assert order == [(0, "regressed"), (5, "errored"), (6, "errored"), (4, "errored"),
                     (2, "unchanged"), (3, "improved"), (1, "improved")]  # fmt: skip
    deltas = {i.datasource_item_id: i.delta for i in found.data}
    assert [deltas[0], deltas[1], deltas[2]] == [-1.0, 1.0, 0.0]
    assert [deltas[4], deltas[5], deltas[6]] == [None, None, None]
    assert deltas[3] == pytest.approx(1 - 2 / 3)
    assert found.counts.model_dump() == {"regressed": 1, "errored": 3, "unchanged": 1,
                                         "improved": 2}  # fmt: skip
    assert (found.first_id, found.last_id, found.has_more) == (0, 1, False)

    # The deltas are what the two runs' own output items say.
    own = {
        run.id: {
            i.datasource_item_id: statistics.fmean(r.score for r in i.results)
            for i in client.evals.runs.output_items.list(run.id, eval_id=eval_id, limit=10).data
            if i.status != "error"
        }
        for run in (base, candidate)
    }
    for item in found.data:
        if item.delta is not None:
            expected = (
                own[candidate.id][item.datasource_item_id] - own[base.id][item.datasource_item_id]
            )
            assert item.delta == pytest.approx(expected)

    france, sky, grass, refused = found.data[:4]
    assert france.datasource_item == QUESTIONS[0]
    assert (france.base.output_text, france.candidate.output_text) == ("Paris", "Lyon")
    assert [(g.name, g.score, g.passed) for g in france.candidate.results] == [
        ("exact", 0.0, False), ("mentions", 0.0, False), ("close", 0.0, False),
        ("rouge", 0.0, False)]  # fmt: skip
    assert (france.base.score, france.candidate.score) == (1.0, 0.0)
    assert (sky.base.status, sky.base.error, sky.base.score) == ("fail", None, 0.0)
    assert (sky.candidate.status, sky.candidate.score) == ("error", None)
    assert sky.candidate.error == "This prompt was refused."
    assert (grass.base.status, grass.base.error) == ("error", "This prompt was refused.")
    assert (grass.candidate.status, grass.candidate.score, grass.candidate.error) == (
        "pass", 1.0, None)  # fmt: skip
    assert refused.base.error == refused.candidate.error == "This prompt was refused."
    for item in found.data:
        for side in (item.base, item.candidate):
            assert side.latency_ms is not None
            assert side.latency_ms > 0

    summaries = (found.base, found.candidate)
    assert [(s.id, s.model, s.items, s.errored) for s in summaries] == [
        (base.id, BASE, 7, 2), (candidate.id, CANDIDATE, 7, 2)]  # fmt: skip
    assert found.base.mean_score == pytest.approx(statistics.fmean([1, 0, PLANET, 2 / 3, 0]))
    assert found.candidate.mean_score == pytest.approx(statistics.fmean([0, 1, PLANET, 1, 1]))
    assert (found.base.pass_rate, found.candidate.pass_rate) == (1 / 7, 3 / 7)
    assert found.base.mean_per_criterion["exact"] == pytest.approx(1 / 5)
    assert found.candidate.mean_per_criterion["exact"] == pytest.approx(3 / 5)
    for summary in summaries:
        assert summary.latency_p50_ms is not None
        assert summary.latency_p95_ms is not None
        assert 0 < summary.latency_p50_ms <= summary.latency_p95_ms

    # Pages of two, in the same order.
    pages, after = [], None
    while True:
        page = compare(client, eval_id, base=base.id, candidate=candidate.id, limit=2,
                       **({"after": after} if after is not None else {}))  # fmt: skip
        pages.append([i.datasource_item_id for i in page.data])
        after = page.last_id
        if not page.has_more:
            break
    assert pages == [[0, 5], [6, 4], [2, 3], [1]]

    # Given samples (a jsonl run) compare too; they have no latency.
    given = _jsonl(
        client, eval_id, [{"item": i, "sample": {"output_text": "Paris"}} for i in ITEMS]
    )
    until_done(client, eval_id, given.id)
    found = compare(client, eval_id, base=given.id, candidate=candidate.id)
    assert (found.base.model, found.base.latency_p50_ms) == (None, None)
    assert all(i.base.latency_ms is None for i in found.data)
    assert (found.data[0].datasource_item_id, found.data[0].delta) == (0, -1.0)


@pytest.mark.slow
def test_runs_that_cannot_be_compared_are_refused_naming_why(stack: Stack) -> None:
    client = stack.client
    eval_id = create_eval(client)
    rows = [{"item": i, "sample": {"output_text": "Paris"}} for i in QUESTIONS]
    done = _jsonl(client, eval_id, rows)
    until_done(client, eval_id, done.id)

    fewer = _jsonl(client, eval_id, rows[:2])
    other_items = _jsonl(
        client, eval_id, [{"item": SKY, "sample": {"output_text": "x"}}, *rows[1:]]
    )
    elsewhere = create_eval(client)
    foreign = _jsonl(client, elsewhere, rows)
    for run in (fewer, other_items):
        until_done(client, eval_id, run.id)
    until_done(client, elsewhere, foreign.id)

    with pytest.raises(openai.ConflictError, match=f"{fewer.id} has 2 items and run {done.id} 5"):
        compare(client, eval_id, base=done.id, candidate=fewer.id)
    with pytest.raises(openai.ConflictError, match=f"item 0 of run {other_items.id} is not item 0"):
        compare(client, eval_id, base=done.id, candidate=other_items.id)
    with pytest.raises(openai.NotFoundError, match=f"candidate: no run of eval {eval_id}"):
        compare(client, eval_id, base=done.id, candidate=foreign.id)
    with pytest.raises(openai.NotFoundError, match="after"):
        compare(client, eval_id, base=done.id, candidate=done.id, after=99)
    with pytest.raises(openai.UnprocessableEntityError, match="candidate"):
        client.get(
            f"/evals/{eval_id}/compare", cast_to=object, options={"params": {"base": done.id}}
        )
    # Another tenant's runs are as unknown as none.
    with pytest.raises(openai.NotFoundError, match="eval_id"):
        compare(stack.other, eval_id, base=done.id, candidate=done.id)
    other_eval = create_eval(stack.other)
    with pytest.raises(openai.NotFoundError, match="base"):
        compare(stack.other, other_eval, base=done.id, candidate=done.id)

    # A run still answering, then canceled, is not compared.
    stack.upstream.held.add(HELD)
    try:
        live = completions_run(client, eval_id, HELD, QUESTIONS)
        with pytest.raises(
            openai.ConflictError, match=f"candidate: run {live.id} is (queued|in_progress)"
        ):
            compare(client, eval_id, base=done.id, candidate=live.id)
        client.evals.runs.cancel(live.id, eval_id=eval_id)
        with pytest.raises(openai.ConflictError, match=f"base: run {live.id} is canceled"):
            compare(client, eval_id, base=live.id, candidate=done.id)
    finally:
        stack.upstream.held.discard(HELD)

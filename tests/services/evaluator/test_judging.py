"""The judge in a job (judging.py) on SQLite and a fake judge, without the runner: a judge_error is
recorded on its item and left out of the mean (never a silent 0), a point without any verdict
makes the decision fall back, the rubric falls back to the default template when the judge cannot
write one and is written again later, and the label routes refuse what they cannot store."""

from __future__ import annotations

import json
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy.engine import Engine

from services.evaluator import api, decision, judge_api, judge_records, records, scoring
from services.evaluator.engine_client import Output
from services.evaluator.graders import Answer
from services.evaluator.judge import JudgeClient
from services.evaluator.judge_replies import Unreadable
from services.evaluator.judging import Judging
from services.evaluator.models import BASE_STEP, EvalJobRow
from services.evaluator.rubric import Rubric, read_rubric
from services.evaluator.subset import EvalItem, item_of
from shared import auth
from shared.db import make_engine, session_scope
from shared.events import JobPlanned
from tests.fakes.judge import FakeJudge
from tests.plugins.infra import free_port
from tests.services.evaluator.samples import reference, ticket

TENANT, VERSION = "acme", "dsv-unit"


@pytest.fixture
def db(tmp_path: Path, sqlite_template: Path) -> Iterator[Engine]:
    shutil.copyfile(sqlite_template, tmp_path / "tuneloop.db")
    engine = make_engine(f"sqlite:///{tmp_path / 'tuneloop.db'}")
    yield engine
    engine.dispose()


@pytest.fixture
async def judging(db: Engine) -> AsyncIterator[tuple[Judging, FakeJudge]]:
    with FakeJudge() as fake:
        client = JudgeClient(
            base_url=fake.base_url,
            api_key="k",
            max_retries=0,
            cache=judge_records.DbVerdictCache(db),
        )
        yield Judging(db=db, client=client, model="judge-model"), fake
        await client.aclose()


def make_job(db: Engine, job_id: str, items: list[EvalItem]) -> EvalJobRow:
    plan = JobPlanned(
        tenant=TENANT,
        job_id=job_id,
        base_model="SmolLM2-135M-Instruct",
        dataset_id="ds",
        dataset_version=VERSION,
        dataset_uri="s3://bucket/tenants/acme/datasets/v1/",
        task_kind="free_text",
        steps=10,
        eval_every=10,
        eval_items=16,
        fine_tuned_model=f"ft:x:{job_id}",
    )
    records.create_job(db, plan, items, None)
    judge_records.mark_judged(
        db, job_id=job_id, tenant=TENANT, dataset_version=VERSION, model="judge-model"
    )
    job = records.get_job(db, job_id)
    assert job is not None
    return job


def answers(items: list[EvalItem], texts: list[str | None]) -> list[scoring.ItemResult]:
    outputs = [
        Output(Answer(), 1.0, error="engine refused the prompt: too long")
        if text is None
        else Output(Answer(text), 1.0)
        for text in texts
    ]
    return scoring.grade("free_text", items, outputs)


ITEMS = [item_of(n, ticket(n)) for n in range(4)]


async def test_a_judge_error_is_recorded_on_its_item_and_left_out_of_the_mean(
    db: Engine, judging: tuple[Judging, FakeJudge]
) -> None:
    judge, fake = judging
    job = make_job(db, "ftjob-errors", ITEMS)
    await judge.ensure_rubric(TENANT, VERSION, ITEMS)
    results = answers(ITEMS, [reference(0), "MALFORMED", "MALFORMED_ONCE [score=5]", None])
    graded, mean = await judge.grade(job, results, scoring.mean_score(results))
    assert mean == pytest.approx((0.9 + 0.5 + 0.0) / 3)  # the refused prompt scores 0 as ever
    right, broken, retried, refused = graded
    assert (right.score, right.detail["judge"]["score"], right.detail["deterministic"]["score"]) == (
        pytest.approx(0.9), 9.0, 1.0,
    )  # fmt: skip
    assert broken.output.error is not None
    assert broken.output.error.startswith("judge_error: unreadable twice")
    assert "judge_error" in broken.detail
    assert broken.detail["deterministic"]["score"] == results[1].score
    assert retried.detail["judge"]["attempts"] == 2
    assert refused is results[3]  # no answer, nothing to judge

    records.add_point(db, job.job_id, 10, "s3://bucket/ckpt-10/")
    records.store_point(
        db, job.job_id, 10, graded, score=mean, uri="s3://x", duration_s=1.0, best_changed=True
    )
    (point,) = (await judge.points(job.job_id, [10])).values()
    assert (point.verdicts, point.judge_errors) == (2, 1)
    assert point.judge_score == pytest.approx(mean)
    assert records.judge_errors(db, job.job_id) == {10: 1}  # what the job's read API shows
    # The judge_error was not kept as the answer's verdict: the same answer is asked again.
    asked = len(fake.graded())
    again, _ = await judge.grade(job, results[1:2], results[1].score)
    assert "judge_error" in again[0].detail
    assert len(fake.graded()) == asked + 2  # asked, and once more quoting why


async def test_a_points_judge_errors_are_asked_again_when_it_is_rescored(
    db: Engine, judging: tuple[Judging, FakeJudge]
) -> None:
    judge, fake = judging
    job = make_job(db, "ftjob-away", ITEMS)
    await judge.ensure_rubric(TENANT, VERSION, ITEMS)
    working, away = (
        judge.client,
        JudgeClient(base_url=f"http://127.0.0.1:{free_port()}/v1", api_key="k", max_retries=0),
    )
    results = answers(ITEMS, [reference(0), reference(1), "MALFORMED", None])
    judge.client = away  # the judge's endpoint is down while the point is scored
    try:
        graded, mean = await judge.grade(job, results, scoring.mean_score(results))
    finally:
        judge.client = working
        await away.aclose()
    assert [("judge_error" in r.detail) for r in graded] == [True, True, True, False]
    records.add_point(db, job.job_id, 10, "s3://bucket/ckpt-10/")
    records.store_point(
        db, job.job_id, 10, graded, score=mean, uri="s3://x", duration_s=1.0, best_changed=True
    )
    # Back up, re-scoring asks again about the answers that had no verdict: the references get
    # theirs (9/10), the malformed reply is still none, the refused prompt was never judged.
    assert await judge.reasked(job, 10) == {0: pytest.approx(0.9), 1: pytest.approx(0.9)}
    assert len(fake.graded()) == 2 + 2  # two verdicts, and the malformed one asked twice


async def test_a_point_without_any_verdict_makes_the_choice_fall_back(
    db: Engine, judging: tuple[Judging, FakeJudge]
) -> None:
    judge, _ = judging
    job = make_job(db, "ftjob-silent", ITEMS)
    await judge.ensure_rubric(TENANT, VERSION, ITEMS)
    base = answers(ITEMS, ["no idea"] * 4)
    base_graded, base_mean = await judge.grade(job, base, scoring.mean_score(base))
    records.store_base(db, job.job_id, BASE_STEP, base_graded, base_mean, "s3://x")
    down = answers(ITEMS, [f"{reference(n)} ERROR500" for n in range(4)])
    graded, mean = await judge.grade(job, down, scoring.mean_score(down))
    assert mean == scoring.mean_score(down)  # no verdict at all: the deterministic mean stands
    assert all(r.detail["judge_error"].startswith("judge endpoint: answered 500") for r in graded)
    records.add_point(db, job.job_id, 10, "s3://bucket/ckpt-10/")
    records.store_point(
        db, job.job_id, 10, graded, score=mean, uri="s3://x", duration_s=1.0, best_changed=True
    )
    records.update_job(db, job.job_id, last_step=10, last_checkpoint_uri="s3://bucket/ckpt-10/")
    job = records.get_job(db, job.job_id)  # type: ignore[assignment]
    choice = await judge.choose(job, {10: mean})
    assert choice is not None
    assert not choice.by_judge
    made = decision.decide(
        kind="free_text", eval_every=10, scores=choice.scores, uris={10: "s3://bucket/ckpt-10/"},
        base_score=choice.base_score, last_step=10, last_uri="s3://bucket/ckpt-10/",
    )  # fmt: skip
    settled = judge.settle(made, choice)
    assert settled.gate_reason.startswith(
        "Checkpoint choice fell back to the deterministic ROUGE-L scores: the judge gave no "
        "verdict at step(s) 10."
    )
    assert settled.scores == {10: pytest.approx(mean)}


async def test_the_rubric_is_the_default_template_when_the_judge_cannot_write_one(
    db: Engine, judging: tuple[Judging, FakeJudge]
) -> None:
    judge, fake = judging
    fake.rubric_reply = "A good answer is correct and complete."
    first = await judge.ensure_rubric(TENANT, "dsv-default", ITEMS)
    assert (first.version, first.source) == (1, "default")
    assert first.note is not None
    assert "the judge could not write a rubric (unreadable twice" in first.note
    examples = judge_records.rubric_of(first).examples
    assert [e.answer for e in examples] == [reference(0), reference(1)]  # the data's own answers
    assert len(fake.calls) == 2  # asked, then asked again quoting why

    fake.rubric_reply = json.dumps({"criteria": ["Right team"], "low": "wrong", "high": "right"})
    second = await judge.ensure_rubric(TENANT, "dsv-default", ITEMS)
    assert (second.version, second.source, second.note) == (2, "generated", None)
    assert (await judge.ensure_rubric(TENANT, "dsv-default", ITEMS)).version == 2
    assert len(fake.calls) == 3  # a written rubric is not written again


def test_a_rubric_that_copies_the_format_back_is_unreadable() -> None:
    echoed = json.dumps(
        {
            "criteria": ["3 to 6 short criteria"],
            "low": "what a 0-3 answer looks like",
            "high": "what an 8-10 answer looks like",
        }
    )
    with pytest.raises(Unreadable, match="repeats the format's placeholders"):
        read_rubric(echoed)
    written = {"criteria": ["Right team"], "low": "wrong", "high": "right"}
    placeholder = {"input": "...", "answer": "...", "score": 0, "why": "..."}
    text, _ = read_rubric(json.dumps({**written, "examples": [placeholder]}))
    assert Rubric.model_validate_json(str(text)).examples == []


@pytest.fixture
async def http(db: Engine) -> AsyncIterator[tuple[httpx.AsyncClient, dict[str, str]]]:
    keys = {}
    with session_scope(db) as session:
        for tenant in (TENANT, "other"):
            auth.ensure_tenant(session, tenant_id=tenant)
            keys[tenant] = f"Bearer {auth.issue_api_key(session, tenant_id=tenant, name='t')[1]}"
    app = FastAPI()
    app.state.db_engine = db
    app.include_router(api.router)
    app.include_router(judge_api.router)
    app.add_exception_handler(api.EvalError, api.eval_error_response)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://evaluator") as client:
        yield client, keys


async def test_labels_and_rubrics_refuse_what_they_cannot_store_and_stay_tenant_scoped(
    db: Engine, http: tuple[httpx.AsyncClient, dict[str, str]]
) -> None:
    client, keys = http
    mine, theirs = {"Authorization": keys[TENANT]}, {"Authorization": keys["other"]}
    job = make_job(db, "ftjob-labels", ITEMS)
    results = answers(ITEMS, [reference(n) for n in range(4)])
    records.store_base(db, job.job_id, BASE_STEP, results, 1.0, "s3://x")
    path = f"/v1/evals/{job.job_id}/points/base/items/2/label"

    stored = await client.put(path, json={"score": 0.8, "note": "close"}, headers=mine)
    assert stored.status_code == 200, stored.text
    assert (stored.json()["kind"], stored.json()["score"], stored.json()["step"]) == (
        "score", 0.8, "base",
    )  # fmt: skip
    both = await client.put(path, json={"score": 0.8, "passed": True}, headers=mine)
    assert both.status_code == 422
    assert "score" in both.text
    wide = await client.put(path, json={"score": 3}, headers=mine)
    assert wide.status_code == 422
    missing = await client.put(path.replace("/2/", "/9/"), json={"passed": True}, headers=mine)
    assert missing.status_code == 404
    assert "position" in missing.json()["detail"]
    assert (await client.put(path, json={"passed": True}, headers=theirs)).status_code == 404
    listed = (await client.get(f"/v1/evals/{job.job_id}/labels", headers=mine)).json()["data"]
    assert [(label["position"], label["note"]) for label in listed] == [(2, "close")]
    assert (await client.delete(path, headers=mine)).status_code == 204
    assert (await client.delete(path, headers=mine)).status_code == 404

    rubric = Rubric(criteria=["Right team"], low="wrong", high="right").model_dump()
    assert (await client.get("/v1/evals/rubrics/dsv-none", headers=mine)).status_code == 404
    put = await client.put("/v1/evals/rubrics/dsv-none", json=rubric, headers=mine)
    assert (put.json()["version"], put.json()["source"]) == (1, "user")
    assert (await client.get("/v1/evals/rubrics/dsv-none", headers=theirs)).status_code == 404
    old = await client.get("/v1/evals/rubrics/dsv-none", params={"version": 5}, headers=mine)
    assert old.status_code == 404
    view = (await client.get(f"/v1/evals/{job.job_id}/judge", headers=mine)).json()
    assert view["calibration"]["reason"] == "no judge is configured"  # this app has none

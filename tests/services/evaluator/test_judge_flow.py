"""A judged job through the evaluator's runner on real S3 and SQLite, in front of the fake hoster
and engine (fakes.py) and a fake judge (tests/fakes/judge.py): the rubric written once from the
data, every answer judged with its deterministic grade kept, the choice falling back to the
deterministic scores in words while the judge is not calibrated (the top checkpoints then
re-scored on the whole split with those scores, no judge asked), people's labels through the
API making it trusted (and the judge then choosing), a rubric edit making a new version that
later verdicts name, and disagreeing labels making it untrusted again."""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy.engine import Engine

from services.evaluator import api, judge_api, records
from services.evaluator.engine_client import HosterClient
from services.evaluator.judge import JudgeClient
from services.evaluator.judge_records import DbVerdictCache
from services.evaluator.judging import Judging
from services.evaluator.runner import Evaluator
from services.scheduler.lifecycle import eval_message
from shared import auth
from shared.db import make_engine, session_scope
from shared.events import (
    CheckpointSaved,
    EvalCompleted,
    EvalDecided,
    Event,
    JobPlanned,
    TrainingCompleted,
)
from shared.settings import Settings
from shared.storage import ObjectStore
from tests.fakes.judge import FakeJudge
from tests.plugins.infra import RunningProcess, bucket_of_its_own
from tests.services.evaluator.fakes import SERVICE_TOKEN, FakeHoster, RunningHoster
from tests.services.evaluator.samples import ticket

TENANT = "acme-judge"


@dataclass
class World:
    db: Engine
    store: ObjectStore
    judge: FakeJudge
    evaluator: Evaluator
    http: httpx.AsyncClient
    dataset_uri: str
    dataset_version: str
    events: list[Event] = field(default_factory=list)

    def of(self, kind: type[Event], job_id: str) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind) and e.job_id == job_id]  # type: ignore[attr-defined]

    async def run(
        self, job_id: str, *, dataset_uri: str = "", dataset_version: str = ""
    ) -> EvalDecided:
        """Plan a 30-step job evaluated every 10 steps, save its checkpoints, end training (on
        the world's dataset, or the one given)."""
        await self.evaluator.planned(
            JobPlanned(
                tenant=TENANT,
                job_id=job_id,
                base_model="SmolLM2-135M-Instruct",
                dataset_id="ds-judge",
                dataset_version=dataset_version or self.dataset_version,
                dataset_uri=dataset_uri or self.dataset_uri,
                task_kind="free_text",
                steps=30,
                eval_every=10,
                eval_items=16,
                fine_tuned_model=f"ft:SmolLM2-135M-Instruct:judge:{job_id}",
            )
        )
        prefix = f"tenants/{TENANT}/jobs/{job_id}/checkpoints"
        for step in (10, 20, 30):
            uri = self.store.uri(f"{prefix}/step-{step:08d}/")
            saved = CheckpointSaved(
                tenant=TENANT, job_id=job_id, attempt_id="a1", step=step, uri=uri
            )
            await self.evaluator.checkpoint_saved(saved)
        ended = TrainingCompleted(
            tenant=TENANT, job_id=job_id, attempt_id="a1", artifact_uri=uri, last_step=30
        )
        await self.evaluator.training_completed(
            ended.model_copy(update={"last_checkpoint_uri": uri})
        )
        (decided,) = self.of(EvalDecided, job_id)
        return decided  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
async def world(
    s3_server: RunningProcess,
    stack_settings: Settings,
    sqlite_template: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[World]:
    tmp = tmp_path_factory.mktemp("judge-flow")
    shutil.copyfile(sqlite_template, tmp / "tuneloop.db")
    db = make_engine(f"sqlite:///{tmp / 'tuneloop.db'}")
    with session_scope(db) as session:
        auth.ensure_tenant(session, tenant_id=TENANT)
        _, key = auth.issue_api_key(session, tenant_id=TENANT, name="tests")
    fake = FakeHoster(skill={"base": 0.25, "ckpt-10": 0.5, "ckpt-20": 1.0, "ckpt-30": 1.0})
    with bucket_of_its_own(stack_settings.s3) as store, RunningHoster(fake), FakeJudge() as judge:
        body = b"".join(ticket(n, tenant=TENANT).to_json_bytes() + b"\n" for n in range(16))
        (tmp / "eval.jsonl").write_bytes(body)
        (tmp / "train.jsonl").write_bytes(b"")
        store.put_dir(tmp, f"tenants/{TENANT}/datasets/judge")
        client = JudgeClient(
            base_url=judge.base_url, api_key="internal-key", max_retries=0,
            cache=DbVerdictCache(db),
        )  # fmt: skip
        judging = Judging(db=db, client=client, model="judge-model", kinds=["free_text"])
        hoster = HosterClient(fake.url, SERVICE_TOKEN)
        events: list[Event] = []

        async def publish(event: Event) -> None:
            events.append(event)

        evaluator = Evaluator(db=db, store=store, hoster=hoster, publish=publish, judging=judging)
        app = FastAPI()
        app.state.db_engine, app.state.judging = db, judging
        app.include_router(api.router)
        app.include_router(judge_api.router)
        app.add_exception_handler(api.EvalError, api.eval_error_response)
        http = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app),
            base_url="http://evaluator",
            headers={"Authorization": f"Bearer {key}"},
        )
        world = World(
            db, store, judge, evaluator, http,
            dataset_uri=store.uri(f"tenants/{TENANT}/datasets/judge/"),
            dataset_version=f"dsv-{uuid.uuid4().hex[:8]}",
            events=events,
        )  # fmt: skip
        try:
            yield world
        finally:
            await http.aclose()
            await hoster.aclose()
            await judging.aclose()
            db.dispose()


@pytest.fixture(scope="module")
async def first_job(world: World) -> tuple[str, EvalDecided]:
    job_id = f"ftjob-{uuid.uuid4().hex[:10]}"
    return job_id, await world.run(job_id)


async def test_the_rubric_is_written_once_and_every_answer_judged_beside_its_grade(
    world: World, first_job: tuple[str, EvalDecided]
) -> None:
    job_id, _ = first_job
    rubric = (await world.http.get(f"/v1/evals/rubrics/{world.dataset_version}")).json()
    assert (rubric["version"], rubric["source"], rubric["judge_model"]) == (
        1,
        "generated",
        "judge-model",
    )
    assert rubric["rubric"]["criteria"][0] == "Routes the ticket to the right team"
    assert len(rubric["rubric"]["examples"]) == 2  # the malformed third example was dropped
    writer = [
        c for c in world.judge.calls if c.body["messages"][0]["content"].startswith("You write")
    ]
    assert len(writer) == 1
    assert "Ticket" in writer[0].body["messages"][1]["content"]  # written from the data
    # The base and three points, 16 answers each: an answer given again (the same item, the
    # same words) is a cached verdict, so no question reaches the judge twice.
    asked = [str(c.body["messages"]) for c in world.judge.graded()]
    assert len(asked) == len(set(asked)) < 4 * 16
    assert {c.headers["x-tuneloop-purpose"] for c in world.judge.calls} == {"judge"}

    completed = {e.step: e.scores["task_score"] for e in world.of(EvalCompleted, job_id)}
    assert completed == {10: pytest.approx(0.55), 20: pytest.approx(0.9), 30: pytest.approx(0.9)}
    items = (await world.http.get(f"/v1/evals/{job_id}/points/20/items")).json()["data"]
    detail = items[0]["detail"]
    assert detail["judge"]["score"] == 9.0
    assert detail["judge"]["rubric_version"] == f"{world.dataset_version}@1"
    assert detail["judge"]["assessment"] == "scored 9 against the reference"
    assert detail["deterministic"]["score"] == 1.0  # ROUGE-L of the reference itself
    assert items[0]["score"] == pytest.approx(0.9)
    again = (await world.http.get(f"/v1/evals/{job_id}/points/30/items")).json()["data"]
    assert all(i["detail"]["judge"]["cached"] for i in again)  # step 20's answers, word for word


async def test_an_uncalibrated_judge_does_not_choose_and_the_job_events_say_so(
    world: World, first_job: tuple[str, EvalDecided]
) -> None:
    job_id, decided = first_job
    assert decided.gate_reason.startswith(
        "Checkpoint choice fell back to the deterministic ROUGE-L scores: the judge's "
        "calibration is 'not enough labels' (0 labelled answers with a judge score; at least "
        "10 are needed)."
    )
    assert (decided.best_step, decided.scores[20], decided.gate) == (20, 1.0, "passed")
    assert decided.scores[10] < 1.0  # ROUGE-L, not the judge's 0.55
    job = SimpleNamespace(best_step=None, gate=None)
    message, _ = eval_message(job, decided)  # type: ignore[arg-type]  # the scheduler's words
    assert "fell back to the deterministic ROUGE-L scores" in message
    view = (await world.http.get(f"/v1/evals/{job_id}/judge")).json()
    assert (view["judged"], view["calibration"]["status"]) == (True, "not enough labels")
    base = view["points"][0]
    assert (base["step"], base["verdicts"], base["judge_errors"]) == ("base", 16, 0)
    assert base["judge_score"] == pytest.approx(0.375)  # 4 right (9/10), 12 wrong (2/10)


async def _label_base(world: World, job_id: str, *, agree: bool) -> None:
    items = (await world.http.get(f"/v1/evals/{job_id}/points/base/items")).json()["data"]
    for item in items:
        right = item["output"]["text"] == item["reference"]["text"]
        path = f"/v1/evals/{job_id}/points/base/items/{item['position']}/label"
        answer = await world.http.put(path, json={"passed": right if agree else not right})
        assert answer.status_code == 200, answer.text


async def test_agreeing_labels_make_the_judge_trusted_and_it_chooses_from_the_cache(
    world: World, first_job: tuple[str, EvalDecided]
) -> None:
    job_id, _ = first_job
    await _label_base(world, job_id, agree=True)
    view = (await world.http.get(f"/v1/evals/{job_id}/judge")).json()
    calibration = view["calibration"]
    assert (calibration["status"], calibration["labels"], calibration["kendall_tau"]) == (
        "trusted", 16, 1.0,
    )  # fmt: skip
    assert calibration["exact_agreement"] == 1.0
    asked = len(world.judge.graded())
    second = f"ftjob-{uuid.uuid4().hex[:10]}"
    decided = await world.run(second)
    assert len(world.judge.graded()) == asked  # same answers, same rubric: all from the cache
    assert decided.gate_reason.startswith("The judge (judge-model, rubric ")
    assert "is trusted: Kendall's tau-b 1.00" in decided.gate_reason
    assert "best judge score 0.900 reaches the judge threshold 0.60" in decided.gate_reason
    assert (decided.best_step, decided.gate) == (20, "passed")
    assert decided.scores == {
        10: pytest.approx(0.55),
        20: pytest.approx(0.9),
        30: pytest.approx(0.9),
    }


async def test_an_edited_rubric_is_named_by_later_verdicts_and_disagreeing_labels_untrust(
    world: World, first_job: tuple[str, EvalDecided]
) -> None:
    job_id, _ = first_job
    path = f"/v1/evals/rubrics/{world.dataset_version}"
    refused = await world.http.put(path, json={"criteria": [], "low": "x", "high": "y"})
    assert refused.status_code == 422
    assert "criteria" in refused.text
    edit = {"criteria": ["The team is right"], "low": "wrong team", "high": "right team"}
    edited = (await world.http.put(path, json=edit)).json()
    assert (edited["version"], edited["source"]) == (2, "user")
    versions = (await world.http.get(f"{path}/versions")).json()["data"]
    assert [v["version"] for v in versions][-1] == edited["version"]
    assert (await world.http.get(path, params={"version": 1})).json()["source"] == "generated"
    await _label_base(world, job_id, agree=False)
    third = f"ftjob-{uuid.uuid4().hex[:10]}"
    decided = await world.run(third)
    items = (await world.http.get(f"/v1/evals/{third}/points/20/items")).json()["data"]
    version = f"{world.dataset_version}@{edited['version']}"
    assert {i["detail"]["judge"]["rubric_version"] for i in items} == {version}
    assert "The team is right" in world.judge.graded()[-1].body["messages"][0]["content"]
    assert decided.gate_reason.startswith(
        "Checkpoint choice fell back to the deterministic ROUGE-L scores: the judge's "
        "calibration is 'untrusted' (Kendall's tau-b -1.00"
    )
    labels = (await world.http.get(f"/v1/evals/{job_id}/labels")).json()["data"]
    assert len(labels) == 16
    assert {label["kind"] for label in labels} == {"pass_fail"}


async def test_a_fallback_rescores_the_top_checkpoints_with_the_deterministic_grader(
    world: World, tmp_path: Path
) -> None:
    # A split of 24: the subset is 16 of them, and re-scoring answers the other 8. No label on
    # this dataset version: the judge is not calibrated, so ROUGE-L chooses.
    prefix = f"tenants/{TENANT}/datasets/judge-wide"
    body = b"".join(ticket(n, tenant=TENANT).to_json_bytes() + b"\n" for n in range(24))
    (tmp_path / "eval.jsonl").write_bytes(body)
    (tmp_path / "train.jsonl").write_bytes(b"")
    world.store.put_dir(tmp_path, prefix)
    job_id, version = f"ftjob-{uuid.uuid4().hex[:10]}", f"dsv-{uuid.uuid4().hex[:8]}"
    asked = len(world.judge.graded())
    decided = await world.run(
        job_id, dataset_uri=world.store.uri(f"{prefix}/"), dataset_version=version
    )
    assert decided.gate_reason.startswith(
        "Checkpoint choice fell back to the deterministic ROUGE-L scores: the judge's "
        "calibration is 'not enough labels'"
    )
    assert (
        "Re-scored the top 3 checkpoints on the whole eval split with the deterministic ROUGE-L "
        "scores too (24 items, the subset's 16 among them): step 20 1.000 (subset 1.000), "
        "step 30 1.000 (subset 1.000), step 10 "
    ) in decided.gate_reason
    assert (decided.best_step, decided.best_score, decided.gate) == (20, 1.0, "passed")
    message, _ = eval_message(SimpleNamespace(best_step=None, gate=None), decided)  # type: ignore[arg-type]
    assert "re-scored the top 3 checkpoints on the whole eval split with the deterministic" in (
        message.lower()
    )
    view = (await world.http.get(f"/v1/evals/{job_id}")).json()
    assert (view["decision"]["rescored_items"], sorted(view["decision"]["rescored"])) == (
        24, ["10", "20", "30"])  # fmt: skip
    # The rest's 3 x 8 answers were graded by ROUGE-L alone: the judge was asked only about
    # the subset's answers at each point (16 x 4 at most, fewer from its cache).
    assert len(world.judge.graded()) - asked <= 16 * 4
    for row in records.rescores(world.db, job_id):
        assert row.grader == "deterministic"
        rest = world.store.get_bytes(row.outputs_uri).splitlines()
        assert len(rest) == 8
        assert all("judge" not in json.loads(line)["detail"] for line in rest)

"""The evaluator's handlers end to end on real NATS, S3 and SQLite, in front of a fake hoster and
engine (tests/services/evaluator/fakes.py): base score, checkpoints scored in step order with a
retry, a redelivered checkpoint not scored twice, the best moving, the decision and the gate,
the engine given back, and the read API on what was stored."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from shared import deadletters
from shared.events import (
    CheckpointSaved,
    TrainingCompleted,
)
from shared.storage import ObjectStore
from tests.services.evaluator.fakes import SERVICE_TOKEN
from tests.services.evaluator.loop import Loop, job_plan, read_api
from tests.services.evaluator.loop import loop as loop  # the fixture, this module's own instance
from tests.services.evaluator.samples import ticket


def _dataset(store: ObjectStore, tmp: Path, tenant: str) -> str:
    # Sixteen tickets: the subset is all of them, and each model's skill is exact (fakes.py).
    body = b"".join(ticket(n, tenant=tenant).to_json_bytes() + b"\n" for n in range(16))
    (tmp / "eval.jsonl").write_bytes(body)
    (tmp / "train.jsonl").write_bytes(b"")
    store.put_dir(tmp, f"tenants/{tenant}/datasets/v1")
    return store.uri(f"tenants/{tenant}/datasets/v1/")


def _checkpoint(loop: Loop, job_id: str, step: int) -> CheckpointSaved:
    uri = loop.store.uri(f"tenants/{loop.tenant}/jobs/{job_id}/checkpoints/step-{step:08d}/")
    return CheckpointSaved(tenant=loop.tenant, job_id=job_id, attempt_id="a1", step=step, uri=uri)


@pytest.fixture(scope="module")
async def scored_job(loop: Loop, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A job of 30 steps, evals every 10: checkpoints 10, 15 (not due), 20 (its engine is still
    loading at the first try), 30 and a second delivery of 10, all sent at once."""
    job_id = f"ftjob-{uuid.uuid4().hex[:12]}"
    uri = _dataset(loop.store, tmp_path_factory.mktemp("dataset"), loop.tenant)
    loop.hoster.loading_once.add(20)
    await loop.publish(job_plan(loop, job_id, uri, eval_every=10))
    for step in (10, 15, 20, 30, 10):
        await loop.publish(_checkpoint(loop, job_id, step))
    last = _checkpoint(loop, job_id, 30)
    await loop.publish(
        TrainingCompleted(
            tenant=loop.tenant,
            job_id=job_id,
            attempt_id="a1",
            artifact_uri=last.uri,
            last_step=30,
            last_checkpoint_uri=last.uri,
        )
    )
    await loop.wait_for(lambda: bool(loop.of("decided", job_id)))
    await loop.wait_for(lambda: bool(loop.hoster.calls_to("DELETE", "/internal/engines/")))
    return job_id


async def test_the_base_and_each_due_checkpoint_are_scored_once_in_step_order(
    loop: Loop, scored_job: str
) -> None:
    (base,) = loop.of("base_scored", scored_job)
    assert (base["score"], base["sample_count"], base["base_model"]) == (
        0.25, 16, "SmolLM2-135M-Instruct",
    )  # fmt: skip
    completed = loop.of("completed", scored_job)
    assert [(e["step"], e["scores"]) for e in completed] == [
        (10, {"task_score": 0.5}),
        (20, {"task_score": 1.0}),
        (30, {"task_score": 1.0}),
    ]
    assert all(e["sample_count"] == 16 for e in completed)
    # 16 generations a point: step 15 was not due, the second delivery of 10 scored nothing.
    models = [c["model"] for c in loop.hoster.completions]
    assert {m: models.count(m) for m in set(models)} == {
        "base": 16, "ckpt-10": 16, "ckpt-20": 16, "ckpt-30": 16,
    }  # fmt: skip
    loads = [c.body["step"] for c in loop.hoster.calls_to("POST", "/internal/engines/") if c.body]
    assert loads == [10, 20, 20, 30]  # step 20 retried after "loading", before 30
    assert all(
        c["temperature"] == 0 and 32 <= c["max_tokens"] <= 1024 for c in loop.hoster.completions
    )
    assert 1 < loop.hoster.most_in_flight <= 8


async def test_the_best_moves_on_a_higher_score_only_and_the_decision_passes_the_gate(
    loop: Loop, scored_job: str
) -> None:
    best = loop.of("best_checkpoint_changed", scored_job)
    assert [(e["step"], e["value"]) for e in best] == [(10, 0.5), (20, 1.0)]  # 30 ties: earlier
    assert best[1]["previous_uri"] == best[0]["checkpoint_uri"]
    (decided,) = loop.of("decided", scored_job)
    assert decided["best_step"] == 20
    assert decided["best_checkpoint_uri"].endswith("/step-00000020/")
    assert (decided["best_score"], decided["base_score"]) == (1.0, 0.25)
    assert decided["scores"] == {"10": 0.5, "20": 1.0, "30": 1.0}
    assert decided["gate"] == "passed", decided["gate_reason"]
    assert (decided["dataset_id"], decided["dataset_version"], decided["auto_deploy"]) == (
        "ds-1", "v1", True,
    )  # fmt: skip
    assert decided["fine_tuned_model"] == f"ft:SmolLM2-135M-Instruct:demo:{scored_job}"


async def test_hoster_calls_carry_the_service_token_and_the_engine_is_given_back_once(
    loop: Loop, scored_job: str
) -> None:
    assert all(c.authorization == f"Bearer {SERVICE_TOKEN}" for c in loop.hoster.calls)
    created = loop.hoster.calls_to("POST", "/internal/engines")
    assert created[0].body == {
        "tenant": loop.tenant, "job_id": scored_job, "base_model": "SmolLM2-135M-Instruct",
    }  # fmt: skip
    assert len(loop.hoster.calls_to("DELETE", "/internal/engines/")) == 1
    assert scored_job not in loop.hoster.engines


async def test_each_points_outputs_are_stored_as_jsonl(loop: Loop, scored_job: str) -> None:
    (completed, *_) = loop.of("completed", scored_job)
    lines = [json.loads(x) for x in loop.store.get_bytes(completed["outputs_uri"]).splitlines()]
    assert len(lines) == 16
    assert {"input", "reference", "output", "score", "latency_ms"} <= set(lines[0])
    assert sum(line["score"] for line in lines) / 16 == 0.5


async def test_a_job_without_evals_is_decided_on_its_last_checkpoint_ungated(loop: Loop) -> None:
    job_id = f"ftjob-{uuid.uuid4().hex[:12]}"
    calls_before = len(loop.hoster.calls)
    await loop.publish(
        job_plan(loop, job_id, loop.store.uri("tenants/x/datasets/none/"), eval_every=0)
    )
    last = _checkpoint(loop, job_id, 30)
    await loop.publish(_checkpoint(loop, job_id, 30))
    await loop.publish(
        TrainingCompleted(
            tenant=loop.tenant, job_id=job_id, attempt_id="a1", artifact_uri=last.uri,
            last_step=30, last_checkpoint_uri=last.uri,
        )
    )  # fmt: skip
    await loop.wait_for(lambda: bool(loop.of("decided", job_id)))
    (decided,) = loop.of("decided", job_id)
    assert (decided["best_step"], decided["best_checkpoint_uri"]) == (30, last.uri)
    assert (decided["gate"], decided["best_score"], decided["scores"]) == (None, None, {})
    assert loop.of("base_scored", job_id) == []
    assert loop.of("completed", job_id) == []
    assert len(loop.hoster.calls) == calls_before  # no engine asked for


async def test_the_read_api_shows_scores_best_step_decision_and_items(
    loop: Loop, scored_job: str
) -> None:
    client, key, _ = read_api(loop)
    headers = {"Authorization": f"Bearer {key}"}
    body = client.get(f"/v1/evals/{scored_job}", headers=headers).json()
    assert (body["base_score"], body["best_step"], body["gate"], body["status"]) == (
        0.25, 20, "passed", "decided",
    )  # fmt: skip
    assert [(p["step"], p["task_score"], p["status"]) for p in body["points"]] == [
        (10, 0.5, "scored"), (15, None, "not_due"), (20, 1.0, "scored"), (30, 1.0, "scored"),
    ]  # fmt: skip
    items = client.get(f"/v1/evals/{scored_job}/points/20/items", headers=headers).json()
    assert len(items["data"]) == 16
    assert all(i["score"] == 1.0 for i in items["data"])
    first = items["data"][0]
    assert first["input"]["messages"][-1]["role"] == "user"
    assert first["output"]["text"] == first["reference"]["text"]
    base = client.get(f"/v1/evals/{scored_job}/points/base/items", headers=headers).json()
    assert sum(i["score"] for i in base["data"]) == 4


async def test_the_read_api_refuses_other_tenants_unknown_jobs_and_bad_steps(
    loop: Loop, scored_job: str
) -> None:
    client, key, other = read_api(loop)
    mine, theirs = {"Authorization": f"Bearer {key}"}, {"Authorization": f"Bearer {other}"}
    assert client.get(f"/v1/evals/{scored_job}", headers=theirs).status_code == 404
    assert client.get(f"/v1/evals/{scored_job}").status_code == 401
    assert client.get("/v1/evals/ftjob-nope", headers=mine).status_code == 404
    bad = client.get(f"/v1/evals/{scored_job}/points/latest/items", headers=mine)
    assert bad.status_code == 422
    assert "step" in bad.json()["detail"]
    unscored = client.get(f"/v1/evals/{scored_job}/points/15/items", headers=mine)
    assert unscored.status_code == 404


async def test_an_event_that_can_never_be_handled_is_dead_lettered_naming_why(
    loop: Loop, scored_job: str
) -> None:
    other = f"o{uuid.uuid4().hex[:10]}"
    bad_uri = _checkpoint(loop, f"ftjob-{uuid.uuid4().hex[:12]}", 10).model_copy(
        update={"uri": "file:///etc/passwd"}
    )
    await loop.publish(bad_uri)
    # Another tenant naming this tenant's job: never scored, never mixed into its points.
    await loop.publish(_checkpoint(loop, scored_job, 40).model_copy(update={"tenant": other}))
    js = loop.broker.connection.jetstream()
    found: list[deadletters.DeadLetter] = []

    async def both() -> bool:
        found[:] = await deadletters.list_dead_letters(js, tenant=loop.tenant) + (
            await deadletters.list_dead_letters(js, tenant=other)
        )
        return len(found) == 2

    async with asyncio.timeout(30):
        while not await both():
            await asyncio.sleep(0.1)
    reasons = sorted(d.reason for d in found)
    assert "uri: scheme of 'file:///etc/passwd' must be 's3://'" in reasons[1]
    assert f"tenant: job {scored_job} is not tenant {other!r}'s" in reasons[0]
    assert 40 not in [p["step"] for p in loop.of("completed", scored_job)]


async def _decided_against(loop: Loop, dataset_uri: str, step: int) -> dict[str, Any]:
    """A job of `step` steps with one checkpoint (its last), auto-deployed under `demo`."""
    job_id = f"ftjob-{uuid.uuid4().hex[:12]}"
    plan = job_plan(loop, job_id, dataset_uri, eval_every=step).model_copy(update={"steps": step})
    await loop.publish(plan)
    last = _checkpoint(loop, job_id, step)
    await loop.publish(last)
    await loop.publish(
        TrainingCompleted(
            tenant=loop.tenant, job_id=job_id, attempt_id="a1", artifact_uri=last.uri,
            last_step=step, last_checkpoint_uri=last.uri,
        )
    )  # fmt: skip
    await loop.wait_for(lambda: bool(loop.of("decided", job_id)))
    (decided,) = loop.of("decided", job_id)
    return decided


async def test_an_auto_deployed_job_is_compared_with_the_version_serving_its_name(
    loop: Loop, scored_job: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    uri = _dataset(loop.store, tmp_path_factory.mktemp("serving"), loop.tenant)
    version = {
        "deployment_id": "dep-1", "version_id": "mv-serving1", "version": 3,
        "model": "ft:SmolLM2-135M-Instruct:demo:ftjob-old", "base_model": "SmolLM2-135M-Instruct",
        "checkpoint_uri": loop.store.uri(f"tenants/{loop.tenant}/jobs/old/checkpoints/s/"),
    }  # fmt: skip
    loop.hoster.serving[(loop.tenant, "demo")] = version
    loop.hoster.skill |= {"ver-mv-serving1": 0.9375, "ckpt-50": 0.875, "ckpt-60": 1.0}
    try:
        worse = await _decided_against(loop, uri, 50)
        better = await _decided_against(loop, uri, 60)
    finally:
        del loop.hoster.serving[(loop.tenant, "demo")]
    # The serving version's checkpoint, loaded under its id, answered the same 16 items.
    loads = [c.body for c in loop.hoster.calls_to("POST", "/internal/engines/") if c.body]
    assert [b for b in loads if b.get("version_id")] == [
        {"uri": version["checkpoint_uri"], "step": 0, "version_id": "mv-serving1"}
    ] * 2
    assert sum(c["model"] == "ver-mv-serving1" for c in loop.hoster.completions) == 32
    assert worse["gate"] == "passed"
    assert (worse["best_score"], worse["serving_score"]) == (0.875, 0.9375)
    assert (worse["serving_version_id"], worse["beats_serving"]) == ("mv-serving1", False)
    assert worse["gate_reason"].endswith(
        "The new version scored 0.875 on 16 eval items; the serving version v3 (mv-serving1) of "
        "'demo' scored 0.938: not deployed as a canary (it must score at least the serving "
        "version's score)."
    )
    assert (better["best_score"], better["serving_score"], better["beats_serving"]) == (
        1.0, 0.9375, True,
    )  # fmt: skip
    assert better["gate_reason"].endswith("scored 0.938: it is deployed as the canary of 'demo'.")
    # The serving version's answers are kept beside the job's.
    key = f"tenants/{loop.tenant}/jobs/{worse['job_id']}/evals/serving-mv-serving1.jsonl"
    assert len(loop.store.get_bytes(loop.store.uri(key)).splitlines()) == 16
    # Nothing serves the name (the other jobs of this module): nothing compared.
    (first,) = loop.of("decided", scored_job)
    assert (first["serving_version_id"], first["beats_serving"]) == (None, None)

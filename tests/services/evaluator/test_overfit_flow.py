"""The overfit stop and the re-scoring end to end on real NATS, S3 and SQLite, in front of the fake
hoster and engine (fakes.py), scripted per checkpoint: which tickets each one answers right.

Job A peaks at step 30 and then falls while its loss keeps falling: the evaluator asks once for
an early stop after step 60; the test, as the scheduler, stops the run at step 65 (not a multiple
of eval_every; 70-100 never come); the decision re-scores the top three and keeps the peak.
Job B looks best at step 14 on the subset, but the whole split prefers step 21.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from services.evaluator import records, subset
from shared.events import CheckpointSaved, JobEarlyStopRequested, TrainingCompleted
from shared.storage import ObjectStore
from tests.services.evaluator.loop import Loop, job_plan, read_api
from tests.services.evaluator.loop import loop as loop  # the fixture, this module's own instance
from tests.services.evaluator.samples import ticket

VERSION = "ov1"
# Per step: tickets right on the subset, and on the rest of the split (16 + 16 tickets).
SUBSET_RIGHT = {10: 8, 20: 12, 30: 14, 40: 13, 50: 12, 60: 11, 65: 10, 7: 12, 14: 14, 21: 13}
REST_RIGHT = {20: 12, 30: 14, 40: 12, 7: 10, 14: 10, 21: 16}
LOSS = {10: 1.2, 20: 0.8, 30: 0.5, 40: 0.3, 50: 0.15, 60: 0.07, 65: 0.04}


class Script:
    """Which tickets each checkpoint (`ckpt-<step>`) answers right: the first k of the subset's
    tickets and the first k of the rest's; the base answers none."""

    def __init__(self, tenant: str) -> None:
        samples = [ticket(n, tenant=tenant) for n in range(32)]
        number = {s.id: n for n, s in enumerate(samples)}
        picked = [number[s.id] for s in subset.pick(samples, size=16, seed=VERSION)]
        self.subset, self.rest = picked, sorted(set(range(32)) - set(picked))

    def __call__(self, model: str, n: int) -> bool:
        if not model.startswith("ckpt-"):
            return False
        step = int(model.removeprefix("ckpt-"))
        return (
            n in self.subset[: SUBSET_RIGHT.get(step, 0)]
            or n in self.rest[: REST_RIGHT.get(step, 0)]
        )


def _dataset(store: ObjectStore, tmp: Path, tenant: str) -> str:
    body = b"".join(ticket(n, tenant=tenant).to_json_bytes() + b"\n" for n in range(32))
    (tmp / "eval.jsonl").write_bytes(body)
    (tmp / "train.jsonl").write_bytes(b"")
    store.put_dir(tmp, f"tenants/{tenant}/datasets/{VERSION}")
    return store.uri(f"tenants/{tenant}/datasets/{VERSION}/")


def _saved(loop: Loop, job_id: str, step: int) -> CheckpointSaved:
    uri = loop.store.uri(f"tenants/{loop.tenant}/jobs/{job_id}/checkpoints/step-{step:08d}/")
    metrics = {"loss": LOSS[step]} if step in LOSS else {}
    return CheckpointSaved(
        tenant=loop.tenant, job_id=job_id, attempt_id="a1", step=step, uri=uri, metrics=metrics
    )


async def _completed(loop: Loop, job_id: str, step: int) -> None:
    last = _saved(loop, job_id, step)
    await loop.publish(
        TrainingCompleted(
            tenant=loop.tenant, job_id=job_id, attempt_id="a1", artifact_uri=last.uri,
            last_step=step, last_checkpoint_uri=last.uri,
        )
    )  # fmt: skip


@pytest.fixture(scope="module")
async def jobs(loop: Loop, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    loop.hoster.right = Script(loop.tenant)
    uri = _dataset(loop.store, tmp_path_factory.mktemp("dataset"), loop.tenant)
    stops: list[dict[str, Any]] = []

    async def seen(msg: Any) -> None:
        stops.append(json.loads(msg.data))

    subject = JobEarlyStopRequested.subject_for(loop.tenant)
    subscription = await loop.broker.connection.subscribe(subject, cb=seen)
    overfit, rescored = f"ftjob-{uuid.uuid4().hex[:12]}", f"ftjob-{uuid.uuid4().hex[:12]}"
    plan = job_plan(loop, overfit, uri, eval_every=10)
    await loop.publish(plan.model_copy(update={"steps": 100, "dataset_version": VERSION}))
    calls_before = len(loop.hoster.completions)
    for step in (10, 20, 30, 40, 50, 60):
        await loop.publish(_saved(loop, overfit, step))
    await loop.wait_for(lambda: bool(stops))
    # The scheduler stops the trainer: it checkpoints at 65 and training ends there. A
    # redelivered checkpoint changes nothing.
    await loop.publish(_saved(loop, overfit, 60).model_copy(update={"event_id": "again"}))
    await loop.publish(_saved(loop, overfit, 65))
    await _completed(loop, overfit, 65)
    await loop.wait_for(lambda: bool(loop.of("decided", overfit)))
    overfit_calls = len(loop.hoster.completions) - calls_before

    plan = job_plan(loop, rescored, uri, eval_every=7)
    await loop.publish(plan.model_copy(update={"steps": 21, "dataset_version": VERSION}))
    for step in (7, 14, 21):
        await loop.publish(_saved(loop, rescored, step))
    await _completed(loop, rescored, 21)
    await loop.wait_for(lambda: bool(loop.of("decided", rescored)))
    await subscription.unsubscribe()
    return {"overfit": overfit, "rescored": rescored, "stops": stops, "calls": overfit_calls}


async def test_a_falling_score_with_a_falling_loss_asks_once_for_an_early_stop(
    loop: Loop, jobs: dict[str, Any]
) -> None:
    (stop,) = jobs["stops"]  # once, though a checkpoint came twice and more were scored after
    assert (stop["job_id"], stop["requested_by"]) == (jobs["overfit"], "evaluator")
    assert stop["event_id"] == f"eval-{jobs['overfit']}-early-stop"
    assert "step 30 0.875, step 40 0.812, step 50 0.750, step 60 0.688" in stop["reason"]
    assert "the best so far is step 30 (0.875)" in stop["reason"]
    job = records.get_job(loop.db, jobs["overfit"])
    assert job is not None
    assert job.early_stop_published
    assert job.early_stop_reason == stop["reason"]
    assert loop.of("decided", jobs["rescored"])  # job B's scores never fell: no stop
    assert all(s["job_id"] == jobs["overfit"] for s in jobs["stops"])


async def test_training_stopped_off_the_cadence_is_decided_on_the_peak_after_rescoring(
    loop: Loop, jobs: dict[str, Any]
) -> None:
    completed = loop.of("completed", jobs["overfit"])
    assert [e["step"] for e in completed] == [10, 20, 30, 40, 50, 60, 65]
    (decided,) = loop.of("decided", jobs["overfit"])
    assert (decided["best_step"], decided["best_score"], decided["base_score"]) == (30, 28 / 32, 0)
    assert decided["scores"]["65"] == 10 / 16
    assert decided["gate"] == "passed", decided["gate_reason"]
    assert decided["gate_reason"] == (
        "Re-scored the top 3 checkpoints on the whole eval split (32 items, the subset's 16 among "
        "them): step 30 0.875 (subset 0.875), step 40 0.781 (subset 0.812), step 20 0.750 (subset "
        "0.750); step 30, the best on the subset, stays the choice. The gate: best task score "
        "0.875 reaches the json threshold 0.80, and on the subset the base answered, its score "
        "0.875 beats the base model's 0.000 by at least 0.05."
    )
    # 16 subset items at the base and 7 points, then only the rest (16) at the top 3.
    assert jobs["calls"] == 16 * 8 + 16 * 3
    rows = {r.step: r for r in records.rescores(loop.db, jobs["overfit"])}
    assert sorted(rows) == [20, 30, 40]
    assert all(r.items == 32 and r.duration_s >= 0 for r in rows.values())
    rest = loop.store.get_bytes(rows[30].outputs_uri).splitlines()
    assert rows[30].outputs_uri.endswith("/evals/step-00000030-rest.jsonl")
    assert len(rest) == 16
    assert all(json.loads(x)["position"] >= 16 for x in rest)


async def test_rescoring_moves_the_choice_when_the_whole_split_disagrees_with_the_subset(
    loop: Loop, jobs: dict[str, Any]
) -> None:
    (decided,) = loop.of("decided", jobs["rescored"])
    assert decided["scores"] == {"7": 0.75, "14": 0.875, "21": 0.8125}
    assert (decided["best_step"], decided["best_score"]) == (21, 29 / 32)
    assert decided["best_checkpoint_uri"].endswith("/step-00000021/")
    reason = decided["gate_reason"]
    assert "the choice moved from step 14, the best on the subset, to step 21" in reason
    client, key, _ = read_api(loop)
    body = client.get(
        f"/v1/evals/{jobs['rescored']}", headers={"Authorization": f"Bearer {key}"}
    ).json()
    assert body["decision"]["rescored"] == {"21": 29 / 32, "14": 0.75, "7": 22 / 32}
    assert (body["decision"]["rescored_items"], body["early_stop_reason"]) == (32, None)
    other = client.get(
        f"/v1/evals/{jobs['overfit']}", headers={"Authorization": f"Bearer {key}"}
    ).json()
    assert other["early_stop_reason"].startswith("overfitting: the task score fell 3 evals")
    assert [p["train_loss"] for p in other["points"]] == [LOSS[s] for s in sorted(LOSS)]

"""What the evaluator says of a job becomes the job's events once each, on SQLite and
PostgreSQL: a checkpoint's score arrives on a subscription of its own, in no order with the
decision, and a job never ends with a score missing from its events."""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import Engine
from sqlmodel import Session

from services.scheduler import jobs
from services.scheduler.lifecycle import record_eval
from services.scheduler.protocol import JobCreate
from shared.db import session_scope
from shared.events import EvalCompleted, EvalDecided

JOB = "ftjob-eval-events"


def _completed(step: int, score: float) -> EvalCompleted:
    return EvalCompleted(
        tenant="acme",
        job_id=JOB,
        checkpoint_uri=f"s3://b/ckpt-{step}",
        step=step,
        scores={"task_score": score},
        sample_count=16,
    )


def _decided(scores: dict[int, float]) -> EvalDecided:
    return EvalDecided(
        tenant="acme",
        job_id=JOB,
        base_model="SmolLM2-135M-Instruct",
        fine_tuned_model=f"ft:SmolLM2-135M-Instruct::{JOB}",
        dataset_id="ds-1",
        dataset_version="v1",
        best_step=40,
        best_checkpoint_uri="s3://b/ckpt-40",
        best_score=0.9,
        base_score=0.1,
        scores=scores,
        gate="passed",
    )


def _create_job(session: Session) -> None:
    request = JobCreate.model_validate({"model": "SmolLM2-135M-Instruct", "training_file": "f"})
    jobs.create(session, job_id=JOB, tenant="acme", request=request, dataset_id="ds-1")


def _scores(db_engine: Engine) -> list[tuple[int, Any]]:
    with session_scope(db_engine) as session:
        listed, _ = jobs.events(session, job_id=JOB, after=None, limit=100)
    return sorted(
        (e.data["step"], e.data["task_score"])
        for e in listed
        if e.type == "metrics" and e.data and "step" in e.data
    )


def test_a_decision_ahead_of_a_score_records_it_and_the_late_score_adds_nothing(
    db_engine: Engine,
) -> None:
    with session_scope(db_engine) as session:
        _create_job(session)
        record_eval(session, _completed(20, 0.5))
        record_eval(session, _completed(20, 0.5))  # redelivered
        record_eval(session, _decided({20: 0.5, 40: 0.9}))  # before step 40's own event
    assert _scores(db_engine) == [(20, 0.5), (40, 0.9)]
    with session_scope(db_engine) as session:
        record_eval(session, _completed(40, 0.9))  # the late one
        record_eval(session, _completed(20, 0.5))
        job = jobs.get(session, tenant="acme", job_id=JOB)
        assert (job.best_step, job.gate) == (40, "passed")
    assert _scores(db_engine) == [(20, 0.5), (40, 0.9)]


def test_another_tenants_event_records_nothing(db_engine: Engine) -> None:
    with session_scope(db_engine) as session:
        _create_job(session)
        record_eval(session, _completed(20, 0.5).model_copy(update={"tenant": "other"}))
    assert _scores(db_engine) == []

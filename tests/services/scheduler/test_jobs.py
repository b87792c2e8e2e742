"""Jobs as rows and as the API shows them, on SQLite and PostgreSQL: tenants apart, pages that
neither skip nor repeat, events and checkpoints recorded once."""

from __future__ import annotations

import json

import pytest
from sqlalchemy.engine import Engine

from services.scheduler import jobs
from services.scheduler.jobs import JobError
from services.scheduler.protocol import JobCreate
from shared.db import session_scope


def _request(**fields: object) -> JobCreate:
    return JobCreate.model_validate(
        {"model": "SmolLM2-135M-Instruct", "training_file": "file-abc", **fields}
    )


def test_a_job_reads_back_as_openais_object_and_only_for_its_tenant(db_engine: Engine) -> None:
    with session_scope(db_engine) as session:
        row = jobs.create(
            session,
            job_id="ftjob-1",
            tenant="acme",
            request=_request(suffix="tickets", seed=7, metadata={"team": "support"}),
            dataset_id="ds_1",
        )
        job = jobs.to_api(row)
        assert job.object == "fine_tuning.job"
        assert (job.status, job.seed, job.suffix, job.metadata) == (
            "validating_files",
            7,
            "tickets",
            {"team": "support"},
        )
        assert job.fine_tuned_model is None
        assert job.hyperparameters is None  # resolved once planned
        with pytest.raises(JobError) as caught:
            jobs.get(session, tenant="other", job_id="ftjob-1")
        assert caught.value.status == 404


def test_pages_go_newest_first_without_gaps(db_engine: Engine) -> None:
    with session_scope(db_engine) as session:
        for n in range(5):
            jobs.create(
                session, job_id=f"ftjob-{n}", tenant="acme", request=_request(), dataset_id=None
            )
        jobs.create(session, job_id="ftjob-x", tenant="other", request=_request(), dataset_id=None)
        seen: list[str] = []
        after = None
        while True:
            rows, more = jobs.page(session, tenant="acme", after=after, limit=2)
            seen += [r.id for r in rows]
            if not more:
                break
            after = rows[-1].id
        assert sorted(seen) == [f"ftjob-{n}" for n in range(5)]
        assert len(seen) == len(set(seen))


def test_events_and_checkpoints_are_recorded_once(db_engine: Engine) -> None:
    with session_scope(db_engine) as session:
        row = jobs.create(
            session, job_id="ftjob-e", tenant="acme", request=_request(), dataset_id=None
        )
        row.plan = jobs.dumps({"fine_tuned_model": "ft:SmolLM2-135M-Instruct::ftjob-e"})
        session.add(row)
        session.commit()
        for _ in range(2):  # a redelivered bus event, a retried report
            jobs.add_event(
                session, row.id, "step 10", type="metrics", data={"step": 10}, event_id="e1"
            )
        assert jobs.record_checkpoint(
            session, job_id=row.id, step=10, uri="s3://b/c/10", train_loss=1.5
        )
        assert not jobs.record_checkpoint(
            session, job_id=row.id, step=10, uri="s3://b/c/10", train_loss=1.5
        )
        jobs.record_checkpoint(session, job_id=row.id, step=20, uri="s3://b/c/20", train_loss=1.0)
        events, _ = jobs.events(session, job_id=row.id, after=None, limit=10)
        assert [e.message for e in events] == ["step 10"]
        assert events[0].data == {"step": 10}
        listed, more = jobs.checkpoints(session, job=row, after=None, limit=1)
        assert more
        assert listed[0].step_number == 20
        assert (
            listed[0].fine_tuned_model_checkpoint
            == "ft:SmolLM2-135M-Instruct::ftjob-e:ckpt-step-20"
        )
        rest, more = jobs.checkpoints(session, job=row, after=listed[0].id, limit=5)
        assert [c.step_number for c in rest] == [10]
        assert not more
        with pytest.raises(JobError, match="after"):
            jobs.events(session, job_id=row.id, after="nope", limit=5)


def test_a_terminal_job_stays_as_it_ended(db_engine: Engine) -> None:
    with session_scope(db_engine) as session:
        row = jobs.create(
            session, job_id="ftjob-t", tenant="acme", request=_request(), dataset_id=None
        )
        jobs.finish(row, "failed", error={"code": "lost", "message": "gone", "param": None})
        jobs.finish(row, "succeeded")
        assert row.status == "failed"
        assert json.loads(row.error or b"{}")["code"] == "lost"
        assert jobs.to_api(row).error is not None

"""The event catalogue: one class per fact, subjects carry tenant and version, bad events are refused."""

import subprocess
import sys

import pytest
from pydantic import ValidationError

from shared import events
from shared.events import CATALOGUE, STREAMS, JobCreated, JobProgressed, ServiceHeartbeat

LOOP_FACTS = {
    "sample.captured", "dataset.built", "job.created", "job.queued", "job.assigned", "job.started",
    "job.progress", "job.checkpoint_saved", "job.rolled_over", "job.succeeded", "job.failed",
    "job.cancelled", "eval.completed", "eval.best_checkpoint_changed", "model.registered",
    "model.alias_changed", "deployment.ready", "deployment.failed", "deployment.stopped",
}  # fmt: skip


def test_catalogue_covers_the_whole_loop() -> None:
    names = {cls.event_name for cls in CATALOGUE.values()}
    assert names >= LOOP_FACTS, f"missing: {sorted(LOOP_FACTS - names)}"


def test_every_persisted_event_lands_in_exactly_one_declared_stream() -> None:
    for cls in CATALOGUE.values():
        if cls.stream is None:
            continue
        subject = cls.subject_for("acme")
        owners = [s.name for s in STREAMS if any(_matches(p, subject) for p in s.subjects)]
        assert owners == [cls.stream.name], f"{cls.__name__}: {subject} captured by {owners}"


def _matches(pattern: str, subject: str) -> bool:
    p, s = pattern.split("."), subject.split(".")
    for i, token in enumerate(p):
        if token == ">":
            return len(s) > i
        if i >= len(s) or (token != "*" and token != s[i]):
            return False
    return len(p) == len(s)


def test_subject_carries_tenant_and_version() -> None:
    event = JobProgressed(
        tenant="acme",
        job_id="job-1",
        attempt_id="a1",
        step=3,
        epoch=0.5,
        loss=1.25,
        learning_rate=1e-4,
    )
    assert event.subject == "tuneloop.acme.job.progress.v1"
    assert JobProgressed.subject_pattern() == "tuneloop.*.job.progress.v1"
    assert event.schema_version == 1
    assert len(event.event_id) == 32
    assert event.occurred_at.tzinfo is not None


def test_round_trip_through_json_is_lossless() -> None:
    event = JobCreated(
        tenant="acme", job_id="job-1", base_model="smollm2", dataset_uri="s3://b/d", method="lora",
        hyperparameters={"rank": 8},
    )  # fmt: skip
    assert JobCreated.model_validate_json(event.model_dump_json()) == event


@pytest.mark.parametrize("tenant", ["Acme", "a.b", "a*", "a>", "", "_system", "x" * 64])
def test_tenants_that_would_break_subjects_are_refused(tenant: str) -> None:
    with pytest.raises(ValidationError) as info:
        JobCreated(tenant=tenant, job_id="j", base_model="m", dataset_uri="s3://b/d", method="lora")
    assert info.value.errors()[0]["loc"] == ("tenant",)


def test_unknown_fields_and_wrong_schema_version_are_refused() -> None:
    with pytest.raises(ValidationError, match="stepz"):
        JobProgressed.model_validate(
            {"tenant": "acme", "job_id": "j", "attempt_id": "a", "step": 1, "stepz": 2,
             "epoch": 0, "loss": 1.0, "learning_rate": 0.1}
        )  # fmt: skip
    with pytest.raises(ValidationError, match="schema_version 2 does not match JobQueued v1"):
        events.JobQueued(tenant="acme", job_id="j", position=0, schema_version=2)


def test_system_events_use_the_system_tenant_on_core_nats() -> None:
    assert ServiceHeartbeat.stream is None
    assert (
        ServiceHeartbeat.subject_for(events.SYSTEM_TENANT)
        == "tuneloop._system.service.heartbeat.v1"
    )


def test_defining_an_event_twice_is_an_error() -> None:
    with pytest.raises(TypeError, match="defined twice"):

        class AnotherQueued(events.JobEvent):
            event_name = "job.queued"
            stream = events.JOBS


def test_module_prints_the_catalogue() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "shared.events"], capture_output=True, text=True, check=True
    )
    assert "tuneloop.*.job.checkpoint_saved.v1" in out.stdout
    assert "TUNELOOP_JOBS" in out.stdout
    assert len(out.stdout.strip().splitlines()) == len(CATALOGUE)

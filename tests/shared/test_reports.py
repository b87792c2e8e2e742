"""Trainer report bodies: every kind round-trips through JSON, bad bodies get errors naming the
field, and each report maps field-for-field onto the bus event the scheduler publishes for it."""

from __future__ import annotations

import json
from datetime import datetime

import pytest
from pydantic import BaseModel

from shared.events import (
    CheckpointSaved,
    Event,
    JobFailed,
    JobProgressed,
    JobSucceeded,
    TrainingCompleted,
)
from shared.reports import (
    CheckpointSavedReport,
    CompletedReport,
    FailedReport,
    ProgressReport,
    ReportError,
    SkippedCheckpoint,
    StartedReport,
    TrainerReport,
    parse_report,
)

COMMON = {"seq": 3, "job_id": "job-1", "attempt_id": "attempt-2", "tenant": "acme"}
REPORTS: list[TrainerReport] = [
    StartedReport(**COMMON, world_size=2, total_steps=100, resumed_from=None, device="cpu", method="lora"),
    ProgressReport(
        **COMMON, step=7, total_steps=100, epoch=0.07, loss=1.25, learning_rate=2e-4,
        grad_norm=0.8, tokens_per_s=1234.5, eta_s=60.0,
    ),
    CheckpointSavedReport(**COMMON, step=50, uri="s3://b/run/checkpoints/step-00000050", metrics={"loss": 0.9}),
    CompletedReport(
        **COMMON, artifact_uri="s3://b/run/final", merged_uri=None, metrics={"loss": 0.7}, steps=100,
        last_checkpoint_uri="s3://b/run/checkpoints/step-00000100", trained_tokens=51200,
    ),
    FailedReport(**COMMON, reason="nan_loss", message="loss became nan at step 12", last_checkpoint_uri=None),
]  # fmt: skip


@pytest.mark.parametrize("report", REPORTS, ids=lambda r: r.kind)
def test_every_kind_round_trips_through_json(report: TrainerReport) -> None:
    parsed = parse_report(report.model_dump_json().encode())

    assert type(parsed) is type(report)
    assert parsed == report
    assert len(report.report_id) == 32


def _body(**fields: object) -> bytes:
    document = json.loads(REPORTS[1].model_dump_json())
    document.update(fields)
    return json.dumps({k: v for k, v in document.items() if v is not None}).encode()


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", "report body is not JSON"),
        (b"[1, 2]", "invalid report: body: Input should be an object"),
        (_body(kind="exploded"), "kind: must be one of started, progress, checkpoint_saved, completed, failed \\(got 'exploded'\\)"),
        (json.dumps({"seq": 1}).encode(), "kind: must be one of .* \\(missing\\)"),
        (_body(step=-1), "invalid progress report: step: Input should be greater than or equal to 0"),
        (_body(loss="NaN"), "loss: Input should be a finite number"),
        (_body(occurred_at="2026-01-01T00:00:00"), "occurred_at: Input should have timezone info"),
        (_body(tenant="Not A Slug"), "tenant: String should match pattern"),
        (_body(secret_extra=1), "secret_extra: Extra inputs are not permitted"),
        (_body(report_id="short"), "report_id: String should match pattern"),
    ],
)  # fmt: skip
def test_bad_bodies_get_errors_naming_the_field(body: bytes, message: str) -> None:
    with pytest.raises(ReportError, match=message):
        parse_report(body)


def test_a_failed_report_only_takes_known_reasons() -> None:
    body = json.loads(REPORTS[4].model_dump_json()) | {"reason": "gremlins"}

    with pytest.raises(ReportError, match="reason: Input should be 'nan_loss', 'error', 'oom'"):
        parse_report(json.dumps(body))


def _as_event(report: BaseModel, event_cls: type[Event]) -> Event:
    """The scheduler's mapping: copy every field the event has, nothing else."""
    shared = set(event_cls.model_fields) - {"event_id", "schema_version"}
    return event_cls.model_validate(report.model_dump(include=shared))


@pytest.mark.parametrize(
    ("report", "event_cls"),
    [
        (REPORTS[1], JobProgressed),
        (REPORTS[2], CheckpointSaved),
        (REPORTS[3], JobSucceeded),
        (REPORTS[4], JobFailed),
    ],
    ids=lambda v: getattr(v, "__name__", ""),
)
def test_each_report_maps_field_for_field_onto_its_event(
    report: TrainerReport, event_cls: type[Event]
) -> None:
    event = _as_event(report, event_cls)

    payload = set(event_cls.model_fields) - {"event_id", "schema_version"}
    assert payload <= set(type(report).model_fields), (
        "every event field has a report field of the same name"
    )
    assert {name: getattr(event, name) for name in payload} == {
        name: getattr(report, name) for name in payload
    }
    assert isinstance(event.occurred_at, datetime)


def test_a_completed_report_maps_onto_training_completed() -> None:
    """The scheduler's mapping for job.training_completed: the same names, `steps` as `last_step`."""
    report = REPORTS[3]
    assert isinstance(report, CompletedReport)
    names = set(TrainingCompleted.model_fields) - {"event_id", "schema_version", "last_step"}
    event = TrainingCompleted.model_validate(
        report.model_dump(include=names) | {"last_step": report.steps}
    )

    assert names <= set(CompletedReport.model_fields)
    assert event.last_checkpoint_uri == "s3://b/run/checkpoints/step-00000100"
    assert (event.last_step, event.trained_tokens) == (100, 51200)
    assert event.artifact_uri == report.artifact_uri


def test_a_completed_report_without_the_new_fields_still_parses() -> None:
    """Reports of trainers from before last_checkpoint_uri / trained_tokens."""
    body = json.loads(REPORTS[3].model_dump_json())
    del body["last_checkpoint_uri"], body["trained_tokens"]

    parsed = parse_report(json.dumps(body))
    assert isinstance(parsed, CompletedReport)
    assert (parsed.last_checkpoint_uri, parsed.trained_tokens) == (None, None)


def test_a_started_report_names_the_checkpoints_it_skipped_if_any() -> None:
    skipped = SkippedCheckpoint(
        uri="s3://b/run/checkpoints/step-00000040", error="adapter_model.safetensors: sha256 ..."
    )
    report = StartedReport(
        **COMMON,
        world_size=1,
        resumed_from="s3://b/run/checkpoints/step-00000030",
        resume_skipped=[skipped],
        device="cpu",
        method="lora",
    )
    parsed = parse_report(report.model_dump_json())
    assert isinstance(parsed, StartedReport)
    assert parsed.resume_skipped == [skipped]

    # None skipped: the body is what a receiver of an older release (no such field) takes.
    assert "resume_skipped" not in json.loads(REPORTS[0].model_dump_json())

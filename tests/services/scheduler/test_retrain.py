"""When a retrain policy is due, and the dataset request a run makes (the whole flow runs in
test_jobs_api.py, on real processes)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from services.scheduler.protocol import JobTemplate, RetrainPolicyCreate, RetrainTrigger
from services.scheduler.retrain import dataset_spec, due

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


def test_a_count_trigger_runs_at_its_count_and_a_schedule_only_with_something_new() -> None:
    count = RetrainTrigger(min_new_samples=100)
    assert due(count, 99, None, NOW) is None
    assert due(count, 100, None, NOW) == "100 new samples (the trigger is 100)"
    daily = RetrainTrigger(every_s=86_400)
    assert due(daily, 0, None, NOW) is None  # nothing new: nothing to learn
    assert due(daily, 5, None, NOW) == "its schedule (every 86400 s) with 5 new samples"
    assert due(daily, 5, NOW - timedelta(hours=23), NOW) is None
    assert due(daily, 5, NOW - timedelta(hours=24), NOW) is not None
    both = RetrainTrigger(min_new_samples=50, every_s=86_400)
    assert due(both, 60, NOW - timedelta(hours=1), NOW) == "60 new samples (the trigger is 50)"


def test_a_run_builds_everything_the_filter_selects_up_to_its_cutoff_for_the_jobs_model() -> None:
    policy = RetrainPolicyCreate(
        name="tickets",
        source={"sources": ["gateway"], "feedback_label": "good"},
        split={"eval_size": 0.1},
        trigger=RetrainTrigger(min_new_samples=10),
        job=JobTemplate(model="SmolLM2-135M-Instruct"),
    )
    assert dataset_spec(policy, name="tickets-3", until=NOW) == {
        "name": "tickets-3",
        "base_model": "SmolLM2-135M-Instruct",
        "source": {"sources": ["gateway"], "feedback_label": "good", "until": NOW.isoformat()},
        "split": {"eval_size": 0.1},
    }
    bounded = policy.model_copy(update={"source": {"until": "2026-12-01T00:00:00Z"}})
    assert dataset_spec(bounded, name="x", until=NOW)["source"] == {"until": "2026-12-01T00:00:00Z"}

"""The job page's data from a job's events (services/ingest/ui/series.py) and the dashboard's
small view helpers (views.py): plain functions over API objects, shaped as the scheduler, the
evaluator and ingest write them."""

from __future__ import annotations

from typing import Any

from services.ingest.ui import series, views


def _metrics(event_id: str, at: int, **data: Any) -> dict[str, Any]:
    return {"id": event_id, "created_at": at, "type": "metrics", "level": "info",
            "message": "", "data": data}  # fmt: skip


def _message(event_id: str, at: int, message: str) -> dict[str, Any]:
    return {"id": event_id, "created_at": at, "type": "message", "level": "info",
            "message": message, "data": None}  # fmt: skip


# Newest first, as GET /v1/fine_tuning/jobs/{id}/events lists them: a first attempt on the local
# provider rolled over at step 20, the second (on another rung) redid step 20 and went on.
EVENTS = [
    _message("e9", 90, "Registered ft:m:x:job (version 1); the job succeeded"),
    _metrics("e8", 80, best_step=40, task_score=0.75),  # not a point: no step
    _metrics("e7", 70, step=40, task_score=0.75),
    _metrics("e6", 60, step=40, train_loss=0.9, learning_rate=1e-4),
    _metrics("e5", 50, step=20, train_loss=1.4, learning_rate=1e-4),
    _message("e4", 40, "Attempt 2 started on the sky provider; resuming from step-20"),
    _message("e3", 30, "Attempt 1 ended: preempted (counts as a failed attempt); the job goes on"),
    _metrics("e2", 20, step=20, train_loss=1.5, learning_rate=1e-4),
    _metrics("e1b", 15, step=20, task_score=0.25),
    _metrics("e1", 10, step=1, train_loss=2.5, learning_rate=0.0),
    _message("e0", 5, "Attempt 1 started on the local provider"),
]


def test_the_curves_points_come_from_the_metrics_events_the_newest_value_per_step() -> None:
    assert series.metric_points(EVENTS, "train_loss") == [(1, 2.5), (20, 1.4), (40, 0.9)]
    assert series.metric_points(EVENTS, "task_score") == [(20, 0.25), (40, 0.75)]


def test_attempts_are_told_by_their_start_and_end_events_oldest_first() -> None:
    assert series.attempt_facts(EVENTS) == [
        {"number": 1, "provider": "local", "started_at": 5},
        {"number": 1, "ended_at": 30, "outcome": "preempted (counts as a failed attempt)"},
        {"number": 2, "provider": "sky", "started_at": 40},
    ]  # fmt: skip
    paused = _message("p", 99, "Paused: attempt 2 stopped after step 40; resume goes on from it")
    assert series.attempt_facts([paused]) == [{"number": 2, "ended_at": 99, "outcome": "paused"}]


def test_a_poll_answers_the_job_and_what_is_new() -> None:
    job = {"status": "running", "created_at": 1, "finished_at": None, "best_step": 40,
           "fine_tuned_model": None, "gate": None}  # fmt: skip
    answer = series.progress(job, EVENTS[:3], complete=True)
    assert answer["newest_event"] == "e9"
    assert (answer["terminal"], answer["best_step"]) == (False, 40)
    assert answer["score"] == [(40, 0.75)]
    assert answer["loss"] == []
    assert [m["message"][:10] for m in answer["messages"]] == ["Registered"]
    nothing_new = series.progress(job | {"status": "succeeded"}, [], complete=True)
    assert nothing_new["newest_event"] is None
    assert nothing_new["terminal"] is True


def test_the_evaluation_page_opens_on_the_best_point_else_the_newest_else_the_base() -> None:
    points = [{"step": 20, "status": "scored"}, {"step": 40, "status": "scored"},
              {"step": 60, "status": "pending"}]  # fmt: skip
    assert series.default_step({"points": points, "best_step": 20}) == 20
    assert series.default_step({"points": points, "best_step": None}) == 40
    assert series.default_step({"points": [], "base_score": 0.1}) == "base"
    assert series.default_step({"points": [], "base_score": None}) is None


def test_an_items_input_assessment_and_output_read_as_text() -> None:
    prompt = {"messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "What is"},
                                     {"type": "image_url", "image_url": {"url": "data:"}}]},
    ]}  # fmt: skip
    assert views.conversation(prompt) == [("system", "Be brief."), ("user", "What is [image_url]")]
    judged = {"judge": {"assessment": "Names the refund policy."}, "deterministic": {}}
    assert views.assessment(judged) == "Names the refund policy."
    assert views.assessment({"judge_error": "timeout"}) == "judge error: timeout"
    assert views.assessment({"fields": {"total": True}}) == '{"fields": {"total": true}}'
    assert views.assessment({}) == ""
    called = {"text": "", "tool_calls": [{"name": "refund"}]}
    assert views.answer_text(called) == ' [tool calls: [{"name": "refund"}]]'
    assert (views.score(None), views.score(0.5), views.when(None)) == ("\u2013", "0.500", "\u2013")


def test_dataset_stats_read_as_one_row_per_figure() -> None:
    stats = {
        "tokenizer": "SmolLM2",
        "train": {"count": 8, "tokens": {"prompt": {"p50": 31, "max": 34}}, "models": {"": 8}},
        "eval": {"count": 2, "tokens": {"prompt": {"p50": 33, "max": 36}}},
    }
    assert views.stat_rows(stats) == [
        ("count", "8", "2"),
        ("tokens.prompt", "p50 31 \u00b7 max 34", "p50 33 \u00b7 max 36"),
        ("models", "(none) 8", "\u2013"),
    ]

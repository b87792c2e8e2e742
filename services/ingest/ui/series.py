"""A job's progress as the job page's charts take it, all from the job's events (so a poll reads
only what is new): the training loss the trainer reported per step and the task score the
evaluator gave each checkpoint (`metrics` events), the best checkpoint (the job's best_step), and
the facts of each attempt (`Attempt N started on the X provider`, `... ended`: the scheduler has no
attempts route). Pure functions over API objects."""

from __future__ import annotations

import re
from typing import Any, Literal

TERMINAL = frozenset({"succeeded", "failed", "cancelled"})
_STARTED = re.compile(r"Attempt (\d+) started on the (\S+) provider")
_ENDED = re.compile(r"Attempt (\d+) ended(?::| and) ([^;]*)")
_PAUSED = re.compile(r"Paused: attempt (\d+) stopped")


def metric_points(events: list[dict[str, Any]], metric: str) -> list[tuple[int, float]]:
    """(step, value) of every metrics event reporting `metric` at a step (`train_loss` from the
    trainer's progress, `task_score` from the evaluator's scoring of a checkpoint), by step; a
    step reported twice (a resumed attempt redoing it) keeps its newest value, as events come
    newest first."""
    points: dict[int, float] = {}
    for event in events:
        data = event.get("data") or {}
        if event.get("type") == "metrics" and "step" in data and data.get(metric) is not None:
            points.setdefault(int(data["step"]), float(data[metric]))
    return sorted(points.items())


def attempt_facts(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the events say of each attempt, oldest first: `{number, provider, started_at}` when
    one started, `{number, ended_at, outcome}` when one ended. The page joins them (an attempt
    with no end of its own ends where the next starts, or with the job)."""
    facts: list[dict[str, Any]] = []
    for event in reversed(events):
        message, at = str(event.get("message", "")), event.get("created_at")
        if started := _STARTED.match(message):
            facts.append({"number": int(started[1]), "provider": started[2], "started_at": at})
        elif ended := _ENDED.match(message):
            facts.append({"number": int(ended[1]), "ended_at": at, "outcome": ended[2]})
        elif paused := _PAUSED.match(message):
            facts.append({"number": int(paused[1]), "ended_at": at, "outcome": "paused"})
    return facts


def progress(
    job: dict[str, Any], events: list[dict[str, Any]], *, complete: bool
) -> dict[str, Any]:
    """The job page's poll answer. `events`: those newer than the page's newest (all of them on
    a first look); `complete` False when older ones were left out (the page then reloads all)."""
    status: str = job["status"]
    return {
        "status": status,
        "terminal": status in TERMINAL,
        "created_at": job.get("created_at"),
        "finished_at": job.get("finished_at"),
        "newest_event": events[0]["id"] if events else None,
        "complete": complete,
        "loss": metric_points(events, "train_loss"),
        "score": metric_points(events, "task_score"),
        "best_step": job.get("best_step"),
        "fine_tuned_model": job.get("fine_tuned_model"),
        "gate": job.get("gate"),
        "messages": [
            {k: e.get(k) for k in ("created_at", "level", "message")}
            for e in events
            if e.get("type") != "metrics"
        ],
        "attempts": attempt_facts(events),
    }


Step = int | Literal["base"]


def default_step(evaluation: dict[str, Any]) -> Step | None:
    """Which point of an evaluation the page shows first: the best one, else the newest scored,
    else the base model's."""
    scored = [p["step"] for p in evaluation.get("points", []) if p.get("status") == "scored"]
    best = evaluation.get("best_step")
    if best is not None and best in scored:
        return int(best)
    if scored:
        return int(max(scored))
    return "base" if evaluation.get("base_score") is not None else None

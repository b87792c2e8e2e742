"""A fine-tuning job followed live (`train`, `jobs follow`): its events as they come, and its
step, loss, latest task score and ETA, until it ends. Everything is read through the gateway
(the job, its events), polled, as any SDK user would.

On a terminal a progress bar holds step / loss / score / ETA and the events print above it; on
a pipe (CI logs, `| tee`) every event is a line, a step's with its ETA, so the log says the same.
"""

from __future__ import annotations

import time
from typing import Any

import openai
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from shared.dev.cli.output import duration, fields, out, text
from shared.dev.cli.output import when as timestamp

ENDED = frozenset({"succeeded", "failed", "cancelled"})
POLL_S = 1.0
HISTORY = 20  # events shown of what happened before following began


def total_steps(job: dict[str, Any]) -> int | None:
    """The plan's step count: the recipe's `steps` decision (known once the job is planned)."""
    for decision in job.get("decisions") or []:
        if decision.get("name") == "steps" and isinstance(decision.get("value"), int | float):
            return int(decision["value"])
    return None


def new_events(
    client: openai.OpenAI, job_id: str, seen: set[str], *, limit: int = 100
) -> list[dict[str, Any]]:
    """The job's events not in `seen`, oldest first (the API lists newest first: pages are read
    back until one holds an event already seen). With nothing seen yet, the newest `limit`."""
    found: list[dict[str, Any]] = []
    after: str | None = None
    while True:
        kwargs: dict[str, Any] = {"limit": limit} | ({"after": after} if after else {})
        page = client.fine_tuning.jobs.list_events(job_id, **kwargs)
        fresh = [e.model_dump() for e in page.data if e.id not in seen]
        found.extend(fresh)
        if not seen or len(fresh) < len(page.data) or not page.has_more or not page.data:
            break
        after = page.data[-1].id
    seen.update(e["id"] for e in found)
    return found[::-1]


def _is_step(data: dict[str, Any]) -> bool:
    return "train_loss" in data and "step" in data and "task_score" not in data


class Pace:
    """Steps a second, from the step events' own times (events read in one poll arrive
    together; when they happened is what counts), and the time left at that pace."""

    def __init__(self) -> None:
        self.first: tuple[int, float] | None = None
        self.last: tuple[int, float] | None = None

    def add(self, step: int, at: float) -> None:
        if self.first is None or (self.last is not None and step < self.last[0]):
            self.first = (step, at)  # the start, or a new attempt going on from a checkpoint
        self.last = (step, at)

    def remaining(self, total: int | None) -> float | None:
        if total is None or self.first is None or self.last is None:
            return None
        steps, seconds = self.last[0] - self.first[0], self.last[1] - self.first[1]
        if steps <= 0 or seconds <= 0:
            return None
        return max(total - self.last[0], 0) * seconds / steps


class JobView:
    """What the user sees while a job runs."""

    def __init__(self) -> None:
        self.live = out.is_terminal
        self.progress = Progress(
            TextColumn("{task.fields[status]}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn(
                "loss {task.fields[loss]}  score {task.fields[score]}  ETA {task.fields[eta]}"
            ),
            console=out,
            disable=not self.live,
        )
        self.task = self.progress.add_task(
            "job", total=None, status="", loss="-", score="-", eta="-"
        )
        self.pace = Pace()
        self.total: int | None = None

    def __enter__(self) -> JobView:
        self.progress.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.progress.stop()

    def eta(self) -> str:
        return duration(self.pace.remaining(self.total))

    def job(self, job: dict[str, Any]) -> None:
        self.total = total_steps(job)
        self.progress.update(self.task, total=self.total, status=job["status"], eta=self.eta())

    def event(self, event: dict[str, Any]) -> None:
        data = event.get("data") or {}
        if _is_step(data):
            self.pace.add(int(data["step"]), float(event["created_at"]))
            loss = text(data["train_loss"])
            self.progress.update(self.task, completed=data["step"], loss=loss, eta=self.eta())
            if self.live:
                return  # the bar says it
        elif "task_score" in data:
            self.progress.update(self.task, score=text(data["task_score"]))
        elif "base_score" in data and self.progress.tasks[0].fields["score"] == "-":
            self.progress.update(self.task, score=f"{text(data['base_score'])} (base)")
        line = f"{timestamp(event['created_at'])[11:]}  {escape(event['message'])}"
        if _is_step(data):
            line += f"  (ETA {self.eta()})"
        level = event.get("level")
        style = {"warn": "yellow", "error": "red"}.get(str(level), "")
        self.progress.console.print(line, style=style, highlight=False, soft_wrap=True)


def follow(client: openai.OpenAI, job_id: str, *, poll_s: float = POLL_S) -> dict[str, Any]:
    """Show the job live until it ends; the job as it ended. Ctrl-C (KeyboardInterrupt) goes to
    the caller, and the job runs on: nothing here changes it."""
    seen: set[str] = set()
    with JobView() as view:
        limit = HISTORY
        while True:
            # The job before its events: if it has ended, its last events are read after.
            job = client.fine_tuning.jobs.retrieve(job_id).model_dump()
            view.job(job)
            for event in new_events(client, job_id, seen, limit=limit):
                view.event(event)
            if job["status"] in ENDED:
                return job
            limit = 100
            time.sleep(poll_s)


def summary(job: dict[str, Any]) -> None:
    error = job.get("error") or {}
    out.print(
        fields(
            f"job {job['id']}",
            [
                ("status", job["status"]),
                ("model", job.get("model")),
                ("fine-tuned model", job.get("fine_tuned_model")),
                ("trained tokens", job.get("trained_tokens")),
                ("base score", job.get("base_score")),
                ("best step", job.get("best_step")),
                ("gate", job.get("gate")),
                ("error", error.get("message")),
                ("finished", timestamp(job.get("finished_at")) if job.get("finished_at") else None),
            ],
        )
    )


def detached(job_id: str, status: str) -> str:
    """What to say when the user stops following: the job goes on, and how to find it again."""
    return (
        f"stopped following; job {job_id} is {status} and goes on. "
        f"Follow it: tuneloop jobs follow {job_id}   cancel it: tuneloop jobs cancel {job_id}"
    )

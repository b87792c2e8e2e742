"""The demo's steps as a tenant takes them: every call goes through the gateway, chat with the
`openai` SDK, our own routes with plain HTTP under the same key (shared/dev/demo/run.py and
shared/dev/demo/retrain.py put them in order)."""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

import httpx
from openai import AsyncOpenAI, OpenAI
from openai.types.chat import ChatCompletionMessageParam
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from shared.catalogue import SMOLLM2_135M_INSTRUCT
from shared.dev.demo.tickets import TEACHER_MODEL, Ticket, field_accuracy

console = Console()
BASE = SMOLLM2_135M_INSTRUCT.id
SUFFIX = "tickets"  # the jobs' suffix: the served name their versions deploy under
# A whole answer is 63 tokens at the median, 70 at most (held-out and training); the base, which
# does not answer with the object, would otherwise ramble on for hundreds.
MAX_TOKENS = 80
# Split and cleaning of every dataset the demo builds, by hand or by its retrain policy.
SPLIT = {"eval_size": 32, "seed": 0}
# The tickets come from a few dozen templates: every eval ticket shares 13-word runs with many
# training tickets, and decontamination would drop half the training set. The comparison at the
# end uses held-out tickets generated apart, never trained on.
CLEANING: dict[str, Any] = {"decontaminate_ngram": None}


def messages(ticket: Ticket) -> list[ChatCompletionMessageParam]:
    return cast(list[ChatCompletionMessageParam], ticket.messages())


@dataclass
class Scored:
    accuracy: float
    latency_s: float


async def replay(client: AsyncOpenAI, tickets: list[Ticket]) -> None:
    """The team's traffic: every ticket asked of the frontier stand-in."""
    gate = asyncio.Semaphore(8)

    async def one(ticket: Ticket) -> None:
        async with gate:
            await client.chat.completions.create(model=TEACHER_MODEL, messages=messages(ticket))

    async with client:
        await asyncio.gather(*(one(t) for t in tickets))


def wait(what: str, check: Any, timeout_s: float, every_s: float = 1.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(every_s)
    raise SystemExit(f"demo: {what} did not happen within {timeout_s:.0f} s")


def captured(http: httpx.Client, count: int, since: datetime) -> None:
    """Wait until the gateway has stored `count` teacher calls made since `since`."""
    wait("capturing the replayed calls", lambda: _count(http, since) >= count, 120)


def dataset(http: httpx.Client, count: int, since: datetime) -> str:
    """A dataset of the calls this run captured (an earlier run's stay out of it)."""
    captured(http, count, since)
    spec = {
        "name": "support tickets (make demo)",
        "base_model": BASE,
        "source": {"models": [TEACHER_MODEL], "since": since.isoformat()},
        "split": SPLIT,
        "cleaning": CLEANING,
    }
    created = http.post("/v1/datasets", json=spec)
    created.raise_for_status()
    dataset_id: str = created.json()["id"]

    def built() -> bool:
        status = http.get(f"/v1/datasets/{dataset_id}").json()["status"]
        if status == "failed":
            raise SystemExit(f"demo: dataset {dataset_id} failed to build")
        return bool(status == "built")

    wait("the dataset build", built, 300)
    return dataset_id


def _count(http: httpx.Client, since: datetime) -> int:
    seen, cursor = 0, None
    while True:
        params: dict[str, Any] = {"model": TEACHER_MODEL, "limit": 500, "since": since.isoformat()}
        if cursor:
            params["cursor"] = cursor
        response = http.get("/v1/samples", params=params)
        response.raise_for_status()
        page = response.json()
        seen += len(page["data"])
        cursor = page.get("next_cursor")
        if not cursor:
            return seen


def train(client: OpenAI, dataset_id: str, budget_s: float) -> Any:
    job = client.fine_tuning.jobs.create(
        model=BASE,
        training_file=dataset_id,
        suffix=SUFFIX,
        extra_body={"auto_deploy": True, "max_duration_s": budget_s},
    )
    console.print(f"job [bold]{job.id}[/] created; decisions:")
    return follow(client, job.id)


def follow(client: OpenAI, job_id: str) -> Any:
    """Show the job's events as they come, with a bar for its steps, until it ends."""
    job = client.fine_tuning.jobs.retrieve(job_id)
    shown: set[str] = set()
    with Progress(
        TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(), console=console,
    ) as progress:  # fmt: skip
        bar = progress.add_task("training", total=None)
        while job.status not in ("succeeded", "failed", "cancelled"):
            for event in reversed(client.fine_tuning.jobs.list_events(job.id, limit=50).data):
                if event.id in shown:
                    continue
                shown.add(event.id)
                data = cast(dict[str, Any], event.data or {})
                if "step" in data and "train_loss" in data:
                    progress.update(bar, completed=data["step"])
                else:
                    progress.console.print(f"  {event.message}")
            job = client.fine_tuning.jobs.retrieve(job.id)
            plan = getattr(job, "hyperparameters", None)
            if plan is not None and progress.tasks[bar].total is None:
                steps = next((d["value"] for d in job.decisions if d["name"] == "steps"), None)  # type: ignore[attr-defined]
                progress.update(bar, total=steps)
            time.sleep(2)
    if job.status != "succeeded":
        raise SystemExit(f"demo: the job ended {job.status}: {job.error}")
    return job


def deployed(http: httpx.Client, name: str) -> None:
    def ready() -> bool:
        listed = http.get("/v1/deployments").json().get("data", [])
        return any(d.get("model") == name and d.get("status") == "ready" for d in listed)

    wait(f"the deployment of {name}", ready, 600, every_s=2)


async def _score(client: AsyncOpenAI, model: str, tickets: list[Ticket]) -> Scored:
    gate = asyncio.Semaphore(16)

    async def one(ticket: Ticket) -> tuple[float, float]:
        async with gate:
            started = time.perf_counter()
            reply = await client.chat.completions.create(
                model=model,
                messages=messages(ticket),
                temperature=0,
                max_tokens=MAX_TOKENS,
            )
            took = time.perf_counter() - started
        return field_accuracy(ticket.answer, reply.choices[0].message.content or ""), took

    results = await asyncio.gather(*(one(t) for t in tickets))
    return Scored(statistics.fmean(a for a, _ in results), statistics.median(t for _, t in results))


async def compare(
    client: AsyncOpenAI, models: dict[str, str], tickets: list[Ticket]
) -> dict[str, Scored]:
    """Each model on the tickets, side by side: every deployment has an engine of its own, so
    asking them together uses both cores."""
    async with client:  # closed inside the loop that opened its connections
        results = await asyncio.gather(*(_score(client, m, tickets) for m in models.values()))
    return dict(zip(models, results, strict=True))

"""`tuneloop train` and `tuneloop jobs list | show | cancel | pause | resume | follow`: OpenAI's
fine-tuning jobs API (the scheduler's, behind the gateway) through the SDK's
`client.fine_tuning.jobs`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import openai
import typer

from shared.dev.cli import follow as live
from shared.dev.cli import uploads
from shared.dev.cli.client import gateway
from shared.dev.cli.errors import INTERRUPTED, NOT_OK, CliError
from shared.dev.cli.output import out, table, when

jobs_app = typer.Typer(no_args_is_help=True, help="Fine-tuning jobs.")
JobId = Annotated[str, typer.Argument(help="a job id (ftjob-...)")]


def register(app: typer.Typer) -> None:
    app.command()(train)
    app.add_typer(jobs_app, name="jobs")


def watch(client: openai.OpenAI, job_id: str) -> None:
    """Follow the job; exit 4 unless it succeeds, 130 (the job going on) on Ctrl-C."""
    try:
        job = live.follow(client, job_id)
    except KeyboardInterrupt:
        status = client.fine_tuning.jobs.retrieve(job_id).status
        out.print(live.detached(job_id, status), highlight=False, soft_wrap=True)
        raise typer.Exit(INTERRUPTED) from None
    live.summary(job)
    if job["status"] != "succeeded":
        raise typer.Exit(NOT_OK)


def _training_file(client: openai.OpenAI, given: str) -> str:
    """A file or dataset id as it is; a local JSONL file is uploaded first (its report shown)."""
    path = Path(given)
    if not path.is_file():
        return given
    created = uploads.send(client, path, "fine-tune", "auto")
    found = uploads.processed(client, str(created["id"]))
    if uploads.show_report(found) and found["status"] != "processed":
        raise CliError(f"{path}: the upload ended {found['status']}; nothing to train on", NOT_OK)
    return str(found["id"])


def _method(epochs: int | None, batch_size: int | None, lr: float | None) -> dict[str, Any] | None:
    given = {"n_epochs": epochs, "batch_size": batch_size, "learning_rate_multiplier": lr}
    hyperparameters = {name: value for name, value in given.items() if value is not None}
    if not hyperparameters:
        return None  # every one "auto": the recipe decides, each with its reason
    return {"type": "supervised", "supervised": {"hyperparameters": hyperparameters}}


def train(
    ctx: typer.Context,
    model: Annotated[str, typer.Option(help="the base model, a catalogue id (models list)")],
    file: Annotated[
        str, typer.Option(help="training data: a file id, a dataset id, or a local JSONL file")
    ],
    validation_file: Annotated[str | None, typer.Option(help="a file id: the eval split")] = None,
    suffix: Annotated[
        str | None, typer.Option(help="in the model's name, ft:<base>:<suffix>")
    ] = None,
    epochs: Annotated[int | None, typer.Option(help="default: the recipe's")] = None,
    batch_size: Annotated[int | None, typer.Option(help="default: the recipe's")] = None,
    learning_rate_multiplier: Annotated[
        float | None, typer.Option(help="default: the recipe's")
    ] = None,
    seed: Annotated[int | None, typer.Option()] = None,
    auto_deploy: Annotated[
        bool, typer.Option(help="deploy the result if it passes the eval gate")
    ] = False,
    max_duration_s: Annotated[float | None, typer.Option(help="a time budget in seconds")] = None,
    detach: Annotated[bool, typer.Option(help="start the job and return")] = False,
) -> None:
    """Start a fine-tuning job and follow it live: step, loss, latest task score, ETA. Ctrl-C
    stops following (exit 130); the job goes on. Exits 4 unless the job succeeds."""
    client = gateway(ctx)
    training_file = _training_file(client, file)
    extra = {"auto_deploy": auto_deploy} | (
        {"max_duration_s": max_duration_s} if max_duration_s else {}
    )
    optional: dict[str, Any] = {
        "validation_file": validation_file,
        "suffix": suffix,
        "seed": seed,
        "method": _method(epochs, batch_size, learning_rate_multiplier),
    }
    job = client.fine_tuning.jobs.create(
        model=model,
        training_file=training_file,
        extra_body=extra,
        **{name: value for name, value in optional.items() if value is not None},
    )
    out.print(f"job {job.id} {job.status}", highlight=False)
    if detach:
        out.print(f"follow it: tuneloop jobs follow {job.id}", highlight=False)
        return
    watch(client, job.id)


@jobs_app.command("list")
def list_jobs(
    ctx: typer.Context,
    limit: Annotated[int, typer.Option(min=1, max=100, help="newest first")] = 20,
) -> None:
    """The tenant's jobs, newest first."""
    page = gateway(ctx).fine_tuning.jobs.list(limit=limit)
    rows = [
        (j.id, j.status, j.model, j.fine_tuned_model, when(j.created_at), when(j.finished_at))
        for j in page.data
    ]
    columns = ("job", "status", "base", "fine-tuned model", "created", "finished")
    out.print(table("fine-tuning jobs", columns, rows))


@jobs_app.command("show")
def show(ctx: typer.Context, job_id: JobId) -> None:
    """A job: status, results, the recipe's decisions with their reasons, its checkpoints."""
    client = gateway(ctx)
    job = client.fine_tuning.jobs.retrieve(job_id).model_dump()
    live.summary(job)
    decisions = [
        (d["name"], d["value"], d["source"], d["reason"]) for d in job.get("decisions") or []
    ]
    if decisions:
        out.print(table("decisions", ("name", "value", "source", "reason"), decisions))
    checkpoints = client.fine_tuning.jobs.checkpoints.list(job_id, limit=100).data
    if checkpoints:
        rows = []
        for checkpoint in checkpoints:
            metrics = checkpoint.metrics.model_dump()
            rows.append((checkpoint.step_number, metrics.get("train_loss"),
                         metrics.get("task_score"), checkpoint.fine_tuned_model_checkpoint))  # fmt: skip
        columns = ("step", "train loss", "task score", "model")
        out.print(table("checkpoints", columns, rows))


def _changed(verb: str, job: Any) -> None:
    out.print(f"job {job.id} {job.status} ({verb})", highlight=False)


@jobs_app.command("cancel")
def cancel(ctx: typer.Context, job_id: JobId) -> None:
    """Cancel a job: its trainer checkpoints and stops."""
    _changed("cancel", gateway(ctx).fine_tuning.jobs.cancel(job_id))


@jobs_app.command("pause")
def pause(ctx: typer.Context, job_id: JobId) -> None:
    """Pause a queued or running job (its trainer checkpoints and exits); resume goes on."""
    _changed("pause", gateway(ctx).fine_tuning.jobs.pause(job_id))


@jobs_app.command("resume")
def resume(ctx: typer.Context, job_id: JobId) -> None:
    """Queue a paused job again, to go on from its newest checkpoint."""
    _changed("resume", gateway(ctx).fine_tuning.jobs.resume(job_id))


@jobs_app.command("follow")
def follow_job(ctx: typer.Context, job_id: JobId) -> None:
    """Follow a job live until it ends (Ctrl-C stops following; the job goes on). Exits 4
    unless it succeeds."""
    watch(gateway(ctx), job_id)

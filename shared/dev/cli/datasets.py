"""`tuneloop datasets build | list | show`: datasets built by ingest (`/v1/datasets`) from
captured traffic and uploaded files, with the cleaning report as a table."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import openai
import typer

from shared.dev.cli.client import gateway, get_json, pages, part, post_json
from shared.dev.cli.errors import NOT_OK, USAGE, CliError
from shared.dev.cli.output import counts, fields, out, table, when

datasets_app = typer.Typer(no_args_is_help=True, help="Datasets: build, list, show.")
POLL_S = 0.5
WAIT_S = 1800.0
_ENDED = ("built", "failed")


def _spec_file(path: Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    try:
        spec = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CliError(f"--spec: {path} is not a readable JSON object ({exc})", USAGE) from None
    if not isinstance(spec, dict):
        raise CliError(f"--spec: {path} holds JSON but not an object", USAGE)
    return spec


def build_spec(
    spec: dict[str, Any],
    *,
    name: str | None,
    files: list[str],
    eval_files: list[str],
    base_model: str | None,
    models: list[str],
    tags: list[str],
    since: str | None,
    eval_size: float | None,
    seed: int | None,
) -> dict[str, Any]:
    """The POST /v1/datasets body: the --spec file, with each option given on top of it."""
    body = dict(spec)
    source = dict(body.get("source") or {})
    for key, value in (("models", models), ("tags", tags), ("since", since)):
        if value:
            source[key] = value
    if source:
        body["source"] = source
    for key, given in (("file_ids", files), ("eval_file_ids", eval_files)):
        if given:
            body[key] = given
    if name:
        body["name"] = name
    if base_model:
        body["base_model"] = base_model
    split = dict(body.get("split") or {})
    if eval_size is not None:
        split["eval_size"] = int(eval_size) if eval_size >= 1 else eval_size
    if seed is not None:
        split["seed"] = seed
    if split:
        body["split"] = split
    if "name" not in body:
        raise CliError("--name: a dataset needs a name (or a --spec file with one)", USAGE)
    return body


def wait_built(client: openai.OpenAI, dataset_id: str, wait_s: float = WAIT_S) -> dict[str, Any]:
    """The dataset once built or failed, showing the step its build is at meanwhile."""
    deadline = time.monotonic() + wait_s
    with out.status(f"building {dataset_id}...") as status:
        while True:
            found = get_json(client, f"/datasets/{part(dataset_id)}")
            if found["status"] in _ENDED:
                return found
            step = (found.get("progress") or {}).get("step")
            status.update(
                f"building {dataset_id}: {found['status']}" + (f", {step}" if step else "")
            )
            if time.monotonic() > deadline:
                raise CliError(f"{dataset_id} is still {found['status']} after {wait_s:.0f} s")
            time.sleep(POLL_S)


def show_dataset(found: dict[str, Any]) -> None:
    """The dataset's fields, then its cleaning report: what each step took out, and why."""
    report = found.get("report") or {}
    out.print(
        fields(
            f"dataset {found['id']}",
            [
                ("name", found.get("name")),
                ("status", found.get("status")),
                ("base model", found.get("base_model")),
                ("created", when(found.get("created_at"))),
                ("finished", when(found.get("finished_at"))),
                ("version", found.get("version")),
                ("train", found.get("train_count")),
                ("eval", found.get("eval_count")),
                ("samples in", report.get("input_count")),
                ("flagged", counts(report.get("flagged")) if report.get("flagged") else None),
                ("pii redacted", counts(report.get("pii")) if report.get("pii") else None),
                ("error", found.get("error")),
            ],
        )
    )
    steps = report.get("steps") or (found.get("progress") or {}).get("steps") or []
    if steps:
        rows = [
            (
                s["step"],
                s.get("samples_in"),
                s.get("samples_out"),
                s.get("removed"),
                s.get("changed"),
                counts(s.get("reasons")),
            )
            for s in steps
        ]
        columns = ("step", "in", "out", "removed", "changed", "reasons")
        out.print(table("cleaning report", columns, rows))


@datasets_app.command("build")
def build(
    ctx: typer.Context,
    name: Annotated[str | None, typer.Option(help="the dataset's name")] = None,
    file: Annotated[
        list[str] | None, typer.Option("--file", help="an uploaded file's id (repeatable)")
    ] = None,
    eval_file: Annotated[
        list[str] | None, typer.Option("--eval-file", help="a file that is the eval split")
    ] = None,
    base_model: Annotated[
        str | None, typer.Option(help="a catalogue id: its tokenizer counts tokens")
    ] = None,
    model: Annotated[
        list[str] | None, typer.Option("--model", help="captured calls to this model")
    ] = None,
    tag: Annotated[
        list[str] | None, typer.Option("--tag", help="captured calls with this tag")
    ] = None,
    since: Annotated[str | None, typer.Option(help="captured at or after (ISO 8601)")] = None,
    eval_size: Annotated[
        float | None, typer.Option(help="eval split: a count (>= 1) or a fraction")
    ] = None,
    seed: Annotated[int | None, typer.Option(help="the split's seed")] = None,
    spec: Annotated[
        Path | None, typer.Option(help="a JSON file with the whole spec (docs/ingest.md)")
    ] = None,
    wait: Annotated[bool, typer.Option(help="wait for the build, then show its report")] = True,
) -> None:
    """Build a dataset from uploaded files and/or captured traffic; shows the build's step, then
    the cleaning report. Exits 4 when the build fails."""
    body = build_spec(
        _spec_file(spec),
        name=name,
        files=file or [],
        eval_files=eval_file or [],
        base_model=base_model,
        models=model or [],
        tags=tag or [],
        since=since,
        eval_size=eval_size,
        seed=seed,
    )
    client = gateway(ctx)
    created = post_json(client, "/datasets", body)
    out.print(f"dataset {created['id']} {created['status']}")
    if not wait:
        return
    found = wait_built(client, str(created["id"]))
    show_dataset(found)
    if found["status"] != "built":
        raise typer.Exit(NOT_OK)


@datasets_app.command("list")
def list_datasets(
    ctx: typer.Context,
    limit: Annotated[int, typer.Option(min=1, help="at most this many, newest first")] = 20,
) -> None:
    """The tenant's datasets, newest first."""
    found = pages(gateway(ctx), "/datasets", limit=limit)
    rows = [
        (d["id"], d["name"], d["status"], d.get("train_count"), d.get("eval_count"),
         d.get("base_model"), when(d.get("created_at")))
        for d in found
    ]  # fmt: skip
    columns = ("dataset", "name", "status", "train", "eval", "base model", "created")
    out.print(table("datasets", columns, rows))


@datasets_app.command("show")
def show(
    ctx: typer.Context, dataset_id: Annotated[str, typer.Argument(help="a dataset id (ds_...)")]
) -> None:
    """A dataset: status, counts, and its cleaning report as a table."""
    show_dataset(get_json(gateway(ctx), f"/datasets/{part(dataset_id)}"))

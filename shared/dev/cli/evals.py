"""`tuneloop evals show | compare`: what the evaluator measured, item by item.

`evals show <job id>` is a job's mid-run evaluation (`/v1/evals/{job_id}`: each checkpoint's
task score, then each item at one point); `evals show <eval_...>` a run of the Evals API
(`client.evals`) with its graded items. `evals compare A B` puts two completed runs of one eval
side by side (`/v1/evals/{eval_id}/compare`), regressions first.
"""

from __future__ import annotations

from typing import Annotated, Any

import openai
import typer

from shared.dev.cli.client import gateway, get_json, part
from shared.dev.cli.errors import USAGE, CliError
from shared.dev.cli.output import fields, out, short, table, text

evals_app = typer.Typer(no_args_is_help=True, help="Eval results: per item, and two runs compared.")


def _prompt(messages: object) -> str:
    """The last user turn of a prompt (what a reader needs to know which item it is)."""
    if isinstance(messages, dict):
        messages = messages.get("messages")
    if isinstance(messages, list):
        for message in reversed(messages):
            if isinstance(message, dict) and message.get("role") == "user":
                return short(message.get("content"))
    return short(messages)


def _point(evaluation: dict[str, Any], step: str | None) -> str:
    """The point to list items of: the one asked, else the best scored, else the base."""
    if step is not None:
        return step
    best = evaluation.get("best_step")
    return str(best) if best is not None else "base"


def show_job(client: openai.OpenAI, job_id: str, step: str | None) -> None:
    evaluation = get_json(client, f"/evals/{part(job_id)}")
    decision = evaluation.get("decision") or {}
    out.print(
        fields(
            f"evaluation of {job_id}",
            [
                ("status", evaluation.get("status")),
                ("task", evaluation.get("task_kind")),
                ("items", evaluation.get("sample_count")),
                ("base score", evaluation.get("base_score")),
                ("best step", evaluation.get("best_step")),
                ("best score", evaluation.get("best_score")),
                ("gate", evaluation.get("gate")),
                ("gate reason", evaluation.get("gate_reason")),
                ("beats serving", decision.get("beats_serving")),
                ("error", evaluation.get("error")),
            ],
        )
    )
    points = [
        (p["step"], p.get("train_loss"), p.get("task_score"), p["status"], p.get("duration_s"))
        for p in evaluation.get("points") or []
    ]
    out.print(table("points", ("step", "train loss", "task score", "status", "seconds"), points))
    if evaluation.get("base_score") is None and step is None:
        return  # nothing scored yet: no items to list
    point = _point(evaluation, step)
    items = get_json(client, f"/evals/{part(job_id)}/points/{part(point)}/items")["data"]
    rows = [
        (i["position"], _prompt(i.get("input")), short(i.get("reference", {}).get("text"), 30),
         short((i.get("output") or {}).get("text"), 40), i["score"], i.get("latency_ms"),
         i.get("error"))
        for i in items
    ]  # fmt: skip
    columns = ("#", "input", "reference", "output", "score", "ms", "error")
    out.print(table(f"items at {point}", columns, rows))


def _output_text(sample: dict[str, Any] | None) -> str:
    """A generated sample's answer (OpenAI's `output` messages), or a given one's `output_text`."""
    sample = sample or {}
    for message in sample.get("output") or []:
        if isinstance(message, dict) and message.get("content"):
            return short(message["content"], 40)
    return short(sample.get("output_text"), 40) if sample.get("output_text") else "-"


def _grades(results: list[dict[str, Any]]) -> str:
    return ", ".join(
        f"{r['name']} {text(r.get('score'))}{'' if r.get('passed') else ' ✗'}" for r in results
    )


def show_run(client: openai.OpenAI, eval_id: str, run_id: str | None) -> None:
    if run_id is None:
        latest = client.evals.runs.list(eval_id, order="desc", limit=1).data
        if not latest:
            raise CliError(f"eval {eval_id} has no runs yet")
        run_id = latest[0].id
    run = client.evals.runs.retrieve(run_id, eval_id=eval_id).model_dump()
    counts = run.get("result_counts") or {}
    out.print(
        fields(
            f"run {run_id}",
            [
                ("eval", eval_id),
                ("name", run.get("name")),
                ("status", run.get("status")),
                ("model", run.get("model")),
                ("items", counts.get("total")),
                ("passed", counts.get("passed")),
                ("failed", counts.get("failed")),
                ("errored", counts.get("errored")),
                ("error", (run.get("error") or {}).get("message")),
            ],
        )
    )
    listed = client.evals.runs.output_items.list(run_id, eval_id=eval_id, limit=100)
    rows = [
        (item["datasource_item_id"], short(item["datasource_item"], 50),
         _output_text(item.get("sample")), item["status"], _grades(item.get("results") or []))
        for item in (found.model_dump() for found in listed)
    ]  # fmt: skip
    out.print(table("items", ("#", "item", "output", "status", "criteria"), rows))


@evals_app.command("show")
def show(
    ctx: typer.Context,
    target: Annotated[str, typer.Argument(help="a job id, or an eval id (eval_...)")],
    step: Annotated[
        str | None, typer.Option(help="a job's point: a step or 'base' (default: the best)")
    ] = None,
    run: Annotated[str | None, typer.Option(help="an eval's run (default: its latest)")] = None,
) -> None:
    """Per-item results: a job's evaluation at one point, or a run of an eval."""
    client = gateway(ctx)
    if target.startswith("eval_"):
        show_run(client, target, run)
    elif run is not None:
        raise CliError("--run: a job's evaluation has points (--step), not runs", USAGE)
    else:
        show_job(client, target, step)


def _eval_of(client: openai.OpenAI, run_id: str) -> str:
    """The eval a run belongs to (the API names runs under their eval)."""
    for candidate in client.evals.list(limit=100):
        try:
            client.evals.runs.retrieve(run_id, eval_id=candidate.id)
        except openai.NotFoundError:
            continue
        return candidate.id
    raise CliError(f"run {run_id} is in none of this tenant's evals (or pass --eval)")


def _side(side: dict[str, Any]) -> str:
    return f"{text(side.get('score'))} {short(side.get('output_text') or side.get('error'), 30)}"


@evals_app.command("compare")
def compare(
    ctx: typer.Context,
    base: Annotated[str, typer.Argument(help="the run compared against")],
    candidate: Annotated[str, typer.Argument(help="the run whose changes are listed")],
    eval_id: Annotated[
        str | None, typer.Option("--eval", help="the runs' eval (default: found from BASE)")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=100, help="items listed")] = 20,
) -> None:
    """Two completed runs of one eval over the same items: each run's summary, then the items
    side by side, regressions first."""
    client = gateway(ctx)
    eval_id = eval_id or _eval_of(client, base)
    found = get_json(
        client, f"/evals/{part(eval_id)}/compare", base=base, candidate=candidate, limit=limit
    )
    runs = [found["base"], found["candidate"]]
    columns = (
        "",
        "run",
        "model",
        "items",
        "errored",
        "mean score",
        "pass rate",
        "p50 ms",
        "p95 ms",
    )
    rows = [
        (role, r["id"], r.get("model"), r["items"], r["errored"], r.get("mean_score"),
         r["pass_rate"], r.get("latency_p50_ms"), r.get("latency_p95_ms"))
        for role, r in zip(("base", "candidate"), runs, strict=True)
    ]  # fmt: skip
    out.print(table(f"{eval_id}: {base} vs {candidate}", columns, rows))
    out.print(", ".join(f"{name} {n}" for name, n in found["counts"].items()), highlight=False)
    items = [
        (i["datasource_item_id"], i["change"], i.get("delta"), _side(i["base"]),
         _side(i["candidate"]))
        for i in found["data"]
    ]  # fmt: skip
    out.print(table("items", ("#", "change", "delta", "base", "candidate"), items))
    if found.get("has_more"):
        out.print(f"more items: --limit (showing {len(items)})", highlight=False)

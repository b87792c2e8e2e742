"""`tuneloop models list` and what serves them: `deploy`, `undeploy`, `deployments`, and a served
name's `canary`, `promote` and `rollback` (the hoster's `/v1/models`, `/v1/deployments` and
`/v1/served_names`, behind the gateway)."""

from __future__ import annotations

import time
from typing import Annotated, Any

import openai
import typer

from shared.dev.cli.client import delete_json, gateway, get_json, part, post_json
from shared.dev.cli.errors import NOT_OK, CliError
from shared.dev.cli.output import fields, out, table, text, when

models_app = typer.Typer(no_args_is_help=True, help="Base and fine-tuned models.")
POLL_S = 1.0
WAIT_S = 600.0
Name = Annotated[str, typer.Argument(help="a served name")]


def register(app: typer.Typer) -> None:
    app.add_typer(models_app, name="models")
    for command in (deploy, undeploy, deployments, canary, promote, rollback):
        app.command()(command)


@models_app.command("list")
def list_models(
    ctx: typer.Context,
    archived: Annotated[bool, typer.Option("--archived", help="archived versions too")] = False,
) -> None:
    """The catalogue's bases and the tenant's fine-tuned names (each its latest version)."""
    query = {"include_archived": "true"} if archived else None
    found = [m.model_dump() for m in gateway(ctx).models.list(extra_query=query)]
    rows = [
        (m["id"], m.get("parent") or "(base)", m.get("version"), m.get("task_score"),
         m.get("base_score"), m.get("gate"), text(m.get("aliases") or None), when(m.get("created")))
        for m in found
    ]  # fmt: skip
    columns = ("model", "base", "version", "task score", "base score", "gate", "aliases", "created")
    out.print(table("models", columns, rows))


def _show_deployment(found: dict[str, Any]) -> None:
    out.print(
        fields(
            f"deployment {found['id']}",
            [
                ("model", found["model"]),
                ("version", found.get("version_id")),
                ("status", found["status"]),
                ("served name", found.get("served_name")),
                ("role", found.get("role")),
                ("pinned", found.get("pinned")),
                ("error", found.get("error")),
            ],
        )
    )


def _wait_ready(client: openai.OpenAI, deployment_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + WAIT_S
    with out.status(f"starting {deployment_id}..."):
        while True:
            found = get_json(client, f"/deployments/{part(deployment_id)}")
            if found["status"] != "pending":
                return found
            if time.monotonic() > deadline:
                raise CliError(f"{deployment_id} is still pending after {WAIT_S:.0f} s")
            time.sleep(POLL_S)


def _deployed(client: openai.OpenAI, body: dict[str, Any], wait: bool) -> None:
    found = post_json(client, "/deployments", body)
    if wait:
        found = _wait_ready(client, found["id"])
    _show_deployment(found)
    if found["status"] == "failed":
        raise typer.Exit(NOT_OK)


def deploy(
    ctx: typer.Context,
    model: Annotated[str, typer.Argument(help="an ft: name (@alias, @n), a version id, a base")],
    served_name: Annotated[
        str | None, typer.Option(help="a stable name callers use; this deployment answers it")
    ] = None,
    pinned: Annotated[
        bool | None, typer.Option("--pinned/--unpinned", help="never unloaded for idling")
    ] = None,
    wait: Annotated[bool, typer.Option(help="wait until it is ready (or failed)")] = True,
) -> None:
    """Deploy a model; the gateway routes calls for it (and its served name) once ready. Exits
    4 when it fails."""
    body = {"model": model, "served_name": served_name, "pinned": pinned}
    _deployed(gateway(ctx), {k: v for k, v in body.items() if v is not None}, wait)


def undeploy(
    ctx: typer.Context, deployment_id: Annotated[str, typer.Argument(help="a deployment id")]
) -> None:
    """Stop a deployment (its engine stops with its last deployment)."""
    _show_deployment(delete_json(gateway(ctx), f"/deployments/{part(deployment_id)}"))


def deployments(ctx: typer.Context) -> None:
    """The tenant's deployments."""
    found = get_json(gateway(ctx), "/deployments")["data"]
    rows = [
        (
            d["id"],
            d["model"],
            d["status"],
            d.get("served_name"),
            d.get("role"),
            when(d["created_at"]),
        )
        for d in found
    ]
    columns = ("deployment", "model", "status", "served name", "role", "created")
    out.print(table("deployments", columns, rows))


def _show_served(found: dict[str, Any]) -> None:
    score = found.get("shadow_score") or None
    out.print(
        fields(
            f"served name {found['name']}",
            [
                ("primary", found.get("primary")),
                ("canary", found.get("canary")),
                ("canary %", found.get("canary_percent") or None),
                ("shadow", found.get("shadow")),
                ("shadow %", found.get("shadow_percent") or None),
                ("shadow score", score),
                ("previous", found.get("previous")),
                ("revision", found.get("revision")),
            ],
        )
    )


def canary(
    ctx: typer.Context,
    name: Name,
    model: Annotated[
        str | None, typer.Argument(help="deploy this model as the canary (else: change the share)")
    ] = None,
    percent: Annotated[
        float, typer.Option(min=0, max=100, help="share of the name's calls (0 ends the canary)")
    ] = 10.0,
    wait: Annotated[bool, typer.Option(help="with MODEL: wait until it is ready")] = True,
) -> None:
    """Send a share of a served name's calls to a canary: a new MODEL deployed as one, or the
    current canary's share changed. It is rolled back by itself when it fails its policy."""
    client = gateway(ctx)
    if model is not None:
        _deployed(client, {"model": model, "served_name": name, "canary_percent": percent}, wait)
        _show_served(get_json(client, f"/served_names/{part(name)}"))
        return
    _show_served(post_json(client, f"/served_names/{part(name)}", {"canary_percent": percent}))


def promote(
    ctx: typer.Context,
    name: Name,
    force: Annotated[
        bool, typer.Option(help="promote a shadow its pairwise score does not call better")
    ] = False,
) -> None:
    """The canary (else the shadow) becomes the served name's primary."""
    body = {"force": True} if force else None
    _show_served(post_json(gateway(ctx), f"/served_names/{part(name)}/promote", body))


def rollback(ctx: typer.Context, name: Name) -> None:
    """Take the canary out; with none, go back to the previous primary."""
    _show_served(post_json(gateway(ctx), f"/served_names/{part(name)}/rollback"))

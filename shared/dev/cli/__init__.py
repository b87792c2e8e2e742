"""`tuneloop`: the operator's command line, for the whole loop. The local stack (stack.py, keys.py),
then through the gateway with the `openai` SDK: uploads, datasets, training and jobs, evals,
models and deployments, chat; and the bus (events.py). docs/cli.md lists every command and the
exit codes (errors.py)."""

from __future__ import annotations

from typing import Annotated

import typer

from shared.dev.cli import chat, datasets, evals, events, jobs, keys, models, stack, uploads
from shared.dev.cli.client import Gateway
from shared.dev.cli.errors import CliGroup

app = typer.Typer(
    cls=CliGroup,
    add_completion=False,
    no_args_is_help=True,
    help="tuneloop: your traffic, your model.",
)


@app.callback()
def root(
    ctx: typer.Context,
    base_url: Annotated[
        str | None,
        typer.Option(
            envvar="TUNELOOP_BASE_URL", help="the gateway's base URL (default: the local stack's)"
        ),
    ] = None,
    api_key: Annotated[
        str | None,
        typer.Option(envvar="TUNELOOP_API_KEY", help="a tenant's API key", show_default=False),
    ] = None,
) -> None:
    ctx.obj = Gateway(base_url=base_url, api_key=api_key)


stack.register(app)
app.add_typer(keys.keys_app, name="keys")
app.command()(uploads.upload)
app.add_typer(datasets.datasets_app, name="datasets")
jobs.register(app)
app.add_typer(evals.evals_app, name="evals")
models.register(app)
app.command()(chat.chat)
app.add_typer(events.events_app, name="events")


def main() -> None:
    app()

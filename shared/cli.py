"""`tuneloop`: the operator's command line (`make up|down|status` call it)."""

from __future__ import annotations

import sys

import typer
from rich.console import Console
from rich.table import Table

from shared import supervisor
from shared.keys_cli import keys_app
from shared.settings import SettingsError, get_settings

app = typer.Typer(
    add_completion=False, no_args_is_help=True, help="tuneloop: your traffic, your model."
)
db_app = typer.Typer(no_args_is_help=True, help="Database schema.")
app.add_typer(db_app, name="db")
app.add_typer(keys_app, name="keys")
console = Console()
err = Console(stderr=True)


def _print_status(states: list[supervisor.ComponentState]) -> None:
    table = Table(title="tuneloop local stack", title_justify="left")
    for column in ("component", "state", "pid", "address"):
        table.add_column(column)
    colours = {"up": "green", "starting": "yellow", "down": "red"}
    for state in states:
        table.add_row(
            state.name,
            f"[{colours[state.state]}]{state.state}[/]",
            str(state.pid or "-"),
            state.address,
        )
    console.print(table)


@app.command()
def up() -> None:
    """Start NATS, S3 and every service in the background (logs under <data_dir>/logs)."""
    settings = get_settings()
    with console.status("starting the stack..."):
        try:
            states = supervisor.up(settings)
        except supervisor.StackError as exc:
            err.print(f"[red]make up failed:[/] {exc}")
            raise typer.Exit(1) from None
    _print_status(states)
    console.print(f"logs: {settings.app.data_dir.resolve() / 'logs'}   stop with: make down")


@app.command()
def down() -> None:
    """Stop exactly the processes `up` started."""
    stopped = supervisor.down(get_settings())
    console.print(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")


@app.command()
def status() -> None:
    """Each component up/down with its address; exits 3 unless all are up."""
    states = supervisor.status(get_settings())
    _print_status(states)
    if any(state.state != "up" for state in states):
        raise typer.Exit(3)


@app.command()
def events() -> None:
    """The event catalogue: subjects, streams and classes."""
    from shared.events import catalogue_rows

    table = Table(title="tuneloop events")
    for column in ("subject", "stream", "class", "meaning"):
        table.add_column(column)
    for row in catalogue_rows():
        table.add_row(*row)
    console.print(table)


@app.command()
def teacher(
    host: str | None = typer.Option(None, help="default: TUNELOOP_BIND_HOST"),
    port: int | None = typer.Option(None, help="default: TUNELOOP_TEACHER_PORT"),
) -> None:
    """Serve the demo's teacher: a rule-based stand-in for a frontier model (OpenAI API)."""
    from shared.demo import teacher as demo_teacher

    settings = get_settings()
    host = host or settings.app.bind_host
    port = port or settings.services.teacher_port
    console.print(f"teacher (a stand-in, not a frontier model) on http://{host}:{port}/v1")
    demo_teacher.serve(host, port)


@db_app.command("upgrade")
def db_upgrade() -> None:
    """Apply every migration to the configured database."""
    from shared import db

    settings = get_settings()
    db.migrate(settings.database_url)
    console.print("database at head")


def main() -> None:
    try:
        app()
    except SettingsError as exc:
        err.print(f"[red]{exc}[/]")
        sys.exit(2)


if __name__ == "__main__":
    main()

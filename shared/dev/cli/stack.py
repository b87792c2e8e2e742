"""The local stack: `up`, `down`, `status` (`make up|down|status` call them), the demo's teacher,
the database schema and the dead letters. These act on this machine's processes, database and
NATS (the settings), not through the gateway, and need no API key."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer
from rich.table import Table

from shared.dev import supervisor
from shared.dev.cli.errors import API_ERROR, UNREACHABLE, USAGE, fail
from shared.dev.cli.output import out as console
from shared.settings import get_settings

db_app = typer.Typer(no_args_is_help=True, help="Database schema.")
deadletters_app = typer.Typer(
    no_args_is_help=True, help="Messages no consumer could handle: list and replay them."
)


def register(app: typer.Typer) -> None:
    for command in (up, down, status, teacher):
        app.command()(command)
    app.add_typer(db_app, name="db")
    app.add_typer(deadletters_app, name="deadletters")


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


def up() -> None:
    """Start NATS, S3 and every service in the background (logs under <data_dir>/logs)."""
    settings = get_settings()
    with console.status("starting the stack..."):
        try:
            states = supervisor.up(settings)
        except supervisor.StackError as exc:
            fail(f"make up failed: {exc}", API_ERROR)
    _print_status(states)
    console.print(f"logs: {settings.app.data_dir.resolve() / 'logs'}   stop with: make down")


def down() -> None:
    """Stop exactly the processes `up` started."""
    stopped = supervisor.down(get_settings())
    console.print(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")


def status() -> None:
    """Each component up/down with its address; exits 3 unless all are up."""
    states = supervisor.status(get_settings())
    _print_status(states)
    if any(state.state != "up" for state in states):
        raise typer.Exit(UNREACHABLE)


def teacher(
    host: str | None = typer.Option(None, help="default: TUNELOOP_BIND_HOST"),
    port: int | None = typer.Option(None, help="default: TUNELOOP_TEACHER_PORT"),
) -> None:
    """Serve the demo's teacher: a rule-based stand-in for a frontier model (OpenAI API)."""
    from shared.dev.demo import teacher as demo_teacher

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


@deadletters_app.command("list")
def deadletters_list(
    tenant: str | None = typer.Option(None, help="Only this tenant's."),
    limit: int = typer.Option(100, min=1, help="At most this many, oldest first."),
) -> None:
    """The dead letters: id (use it with replay), original subject, consumer, when, why."""
    from shared import deadletters

    letters = asyncio.run(
        deadletters.operator_list(get_settings().nats, tenant=tenant, limit=limit)
    )
    table = Table(title="tuneloop dead letters", title_justify="left")
    for column in ("id", "subject", "consumer", "deliveries", "at", "reason"):
        table.add_column(column)
    for letter in letters:
        table.add_row(
            str(letter.seq),
            letter.subject,
            letter.consumer,
            str(letter.deliveries),
            letter.at,
            letter.reason,
        )
    console.print(table)


@deadletters_app.command("replay")
def deadletters_replay(
    seq: Annotated[
        list[int] | None, typer.Option("--id", "--seq", help="A dead letter's id (repeatable).")
    ] = None,
    replay_all: bool = typer.Option(False, "--all", help="Every dead letter (of --tenant)."),
    tenant: str | None = typer.Option(None, help="With --all: only this tenant's."),
) -> None:
    """Send dead letters back to their original subject, then remove them from the stream."""
    from shared import deadletters

    if bool(seq) == replay_all:
        fail("name dead letters with --id, or replay them all with --all", USAGE)
    try:
        replayed = asyncio.run(
            deadletters.operator_replay(
                get_settings().nats, seq or [], replay_all=replay_all, tenant=tenant
            )
        )
    except deadletters.UnknownDeadLetter as exc:
        fail(str(exc), API_ERROR)
    console.print(f"replayed {len(replayed)}: {', '.join(str(n) for n in replayed) or '-'}")

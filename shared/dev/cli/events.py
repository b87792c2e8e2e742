"""`tuneloop events`: the event catalogue, and `events tail`, the bus as an integrator reads it:
a plain NATS subscription to `tuneloop.<tenant>.>` (which NATS permissions can grant one tenant),
every event printed as it is published, from now on (docs/architecture.md, docs/bus.md)."""

from __future__ import annotations

import asyncio
import fnmatch
import json
import re
from typing import Annotated, Any

import nats
import typer
from nats.aio.msg import Msg
from nats.errors import NoServersError
from rich.markup import escape

from shared.dev.cli.errors import UNREACHABLE, USAGE, CliError, err
from shared.dev.cli.output import out, short, table
from shared.events import SUBJECT_ROOT, SYSTEM_TENANT, catalogue_rows
from shared.settings import get_settings
from shared.tenancy import is_tenant_id

events_app = typer.Typer(
    invoke_without_command=True, help="The event catalogue; `tail` follows the bus live."
)
_VERSION = re.compile(r"\.v\d+$")
# The envelope every event has; the line shows the rest.
_ENVELOPE = ("event_id", "occurred_at", "schema_version", "tenant")


@events_app.callback()
def catalogue(ctx: typer.Context) -> None:
    """The event catalogue: subjects, streams and classes."""
    if ctx.invoked_subcommand is not None:
        return
    rows = catalogue_rows()
    out.print(table("tuneloop events", ("subject", "stream", "class", "meaning"), rows))


def name_of(subject: str) -> tuple[str, str]:
    """(tenant, event name without its version) of a subject, e.g. ('acme', 'job.progress')."""
    _, tenant, rest = subject.split(".", 2)
    return tenant, _VERSION.sub("", rest)


def line(subject: str, payload: dict[str, Any]) -> str:
    """One event for people: time, tenant, name, then its own fields as key=value."""
    tenant, name = name_of(subject)
    at = str(payload.get("occurred_at", ""))[11:19]
    body = " ".join(
        f"{key}={short(value, 80)}"
        for key, value in payload.items()
        if key not in _ENVELOPE and value not in (None, [], {})
    )
    return f"{at}  {tenant}  {name}  {body}"


class Tail:
    """Prints the events of one subscription that pass the filters, up to `count`."""

    def __init__(self, filters: list[str], count: int | None, as_json: bool, system: bool):
        self.filters, self.count, self.as_json, self.system = filters, count, as_json, system
        self.shown = 0

    def wanted(self, subject: str) -> bool:
        tenant, name = name_of(subject)
        if tenant == SYSTEM_TENANT and not self.system:
            return False  # heartbeats every 2 s: asked for by --tenant _system
        return not self.filters or any(fnmatch.fnmatchcase(name, f) for f in self.filters)

    def show(self, message: Msg) -> bool:
        """Print what the message carries (a bundle carries a JSON document a line); False once
        `count` events have been shown."""
        if not self.wanted(message.subject):
            return True
        for document in message.data.split(b"\n"):
            if self.as_json:
                out.print(document.decode(), markup=False, highlight=False, soft_wrap=True)
            else:
                try:
                    payload = json.loads(document)
                except ValueError:
                    payload = {"unreadable": short(document.decode(errors="replace"))}
                out.print(escape(line(message.subject, payload)), highlight=False, soft_wrap=True)
            self.shown += 1
            if self.count is not None and self.shown >= self.count:
                return False
        return True


async def _quiet(exc: Exception) -> None:
    """nats-py's connection errors: reconnecting is its job, and the CLI says so once."""


async def run_tail(url: str, subject: str, tail: Tail) -> None:
    try:
        connection = await nats.connect(
            url, connect_timeout=2, max_reconnect_attempts=5, reconnect_time_wait=1,
            error_cb=_quiet,
        )  # fmt: skip
    except (NoServersError, OSError, TimeoutError) as exc:
        why = str(exc) or type(exc).__name__
        raise CliError(f"cannot reach NATS at {url} ({why})", UNREACHABLE) from None
    try:
        subscription = await connection.subscribe(subject)
        await connection.flush()  # the server has the subscription: nothing after this is missed
        err.print(f"listening on {subject} at {url} (Ctrl-C stops)", highlight=False)
        async for message in subscription.messages:
            if not tail.show(message):
                break
    finally:
        await connection.close()


@events_app.command("tail")
def tail(
    tenant: Annotated[str, typer.Option(help="whose events ('*': every tenant's)")] = "*",
    filter: Annotated[
        list[str] | None,
        typer.Option("--filter", help="event names to show, globs (job.*, deployment.ready)"),
    ] = None,
    count: Annotated[int | None, typer.Option(min=1, help="stop after this many")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="each event's JSON, a line each")] = False,
    nats_url: Annotated[str | None, typer.Option(help="default: TUNELOOP_NATS_URL")] = None,
) -> None:
    """Print events as they are published, from now on, as an integrator subscribes to them."""
    if tenant not in ("*", SYSTEM_TENANT) and not is_tenant_id(tenant):
        raise CliError(f"--tenant: {tenant!r} is not a tenant id (or '*')", USAGE)
    url = nats_url or get_settings().nats.url
    subject = f"{SUBJECT_ROOT}.{tenant}.>"
    shown = Tail(filter or [], count, as_json, system=tenant == SYSTEM_TENANT)
    asyncio.run(run_tail(url, subject, shown))

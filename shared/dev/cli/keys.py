"""`tuneloop keys`: issue, list and revoke a tenant's API keys against the configured database.

The operator's way in (no admin token to pass around): `keys create` migrates the database if it
is behind, creates the tenant if it is new, and prints the key once with the gateway's base URL.
It is also the only way to issue an `internal` key (docs/keys.md).
"""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.table import Table
from sqlalchemy.engine import Engine

from shared import auth, db
from shared.dev.cli.client import gateway_base_url
from shared.dev.cli.errors import API_ERROR, USAGE, CliError
from shared.dev.cli.output import out as console
from shared.settings import Settings, get_settings

keys_app = typer.Typer(no_args_is_help=True, help="A tenant's API keys (printed once).")

TenantOpt = Annotated[str, typer.Option("--tenant", help="tenant id, e.g. acme")]


def _engine(settings: Settings) -> Engine:
    db.migrate(settings.database_url)  # a no-op at head; a fresh install needs no other step
    return db.make_engine(settings.database_url)


@keys_app.command("create")
def create(
    tenant: TenantOpt,
    scope: Annotated[
        str, typer.Option(help="read, write, admin or internal (the platform's own services)")
    ] = auth.DEFAULT_SCOPE,
    name: Annotated[str | None, typer.Option(help="a label shown in listings")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object, for scripts")] = False,
) -> None:
    """Issue a key (creating the tenant if new); the key is printed this once."""
    settings = get_settings()
    engine = _engine(settings)
    try:
        with db.session_scope(engine) as session:
            created = auth.ensure_tenant(session, tenant_id=tenant)
            key, plaintext = auth.issue_api_key(
                session, tenant_id=tenant, name=name or f"{scope} key", scope=scope
            )
    except auth.AuthInputError as exc:
        message = str(exc).replace("tenant_id:", "--tenant:").replace("scope:", "--scope:")
        raise CliError(message, USAGE) from None
    finally:
        engine.dispose()
    base_url = gateway_base_url(settings)
    if as_json:
        fields = {"id": key.id, "tenant": tenant, "scope": key.scope, "prefix": key.prefix}
        typer.echo(json.dumps({**fields, "key": plaintext, "base_url": base_url}))
        return
    # typer.echo, not rich: the key must come out on one line, never wrapped or styled.
    if created:
        typer.echo(f"created tenant {tenant}")
    typer.echo(f"{key.scope} key {key.id} for tenant {tenant} (shown once, store it now):")
    typer.echo(plaintext)
    typer.echo(f"base URL: {base_url}")
    typer.echo(f"use: OPENAI_BASE_URL={base_url} OPENAI_API_KEY=<the key above>")


@keys_app.command("list")
def list_keys(tenant: TenantOpt) -> None:
    """The tenant's keys: ids, prefixes and scopes (never the keys themselves)."""
    engine = _engine(get_settings())
    try:
        with db.session_scope(engine) as session:
            if session.get(auth.Tenant, tenant) is None:
                raise CliError(f"--tenant: tenant {tenant!r} does not exist", API_ERROR)
            keys = auth.list_api_keys(session, tenant_id=tenant)
    finally:
        engine.dispose()
    table = Table(title=f"API keys of {tenant}", title_justify="left")
    for column in ("id", "name", "prefix", "scope", "created", "last used", "revoked"):
        # Ids and prefixes are copied from here: never wrapped, the other columns give way.
        kept = column in ("id", "prefix", "scope")
        table.add_column(column, no_wrap=kept, min_width=None if kept else 4, overflow="fold")
    for key in keys:
        table.add_row(
            key.id,
            key.name,
            f"tl_{key.prefix}_…",
            key.scope,
            f"{key.created_at:%Y-%m-%d}",
            f"{key.last_used_at:%Y-%m-%d}" if key.last_used_at else "-",
            f"{key.revoked_at:%Y-%m-%d}" if key.revoked_at else "-",
        )
    console.print(table)


@keys_app.command("revoke")
def revoke(
    tenant: TenantOpt, key_id: Annotated[str, typer.Argument(help="the id `keys list` shows")]
) -> None:
    """Revoke one of the tenant's keys (again: no change). The gateway stops taking it within
    its key cache time (30 s)."""
    engine = _engine(get_settings())
    try:
        with db.session_scope(engine) as session:
            key = auth.revoke_api_key(session, tenant_id=tenant, key_id=key_id)
    except auth.ApiKeyNotFoundError as exc:
        raise CliError(str(exc), API_ERROR) from None
    finally:
        engine.dispose()
    typer.echo(f"revoked key {key.id} (tl_{key.prefix}_…) of tenant {tenant}")

"""The gateway as the CLI's commands reach it: the official `openai` SDK at the gateway's base
URL with the tenant's key (`--base-url` / TUNELOOP_BASE_URL, `--api-key` / TUNELOOP_API_KEY),
typed resources where OpenAI has them, the SDK's generic get / post for tuneloop's own routes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import openai
import typer

from shared.dev.cli.errors import USAGE, CliError
from shared.settings import Settings, get_settings

# A CLI call that hangs is worse than one that fails: a minute, and one retry of a dropped
# connection or a 5xx (the SDK's own backoff).
TIMEOUT_S = 60.0
MAX_RETRIES = 1


def gateway_base_url(settings: Settings) -> str:
    """Where OpenAI SDKs point `base_url` (a server bound to every address is reached locally)."""
    return f"{settings.local_url('ingest')}/v1"


@dataclass
class Gateway:
    """The root options; the client is made on first use, so local commands need no key."""

    base_url: str | None = None
    api_key: str | None = None
    _client: openai.OpenAI | None = field(default=None, repr=False)

    def url(self) -> str:
        return (self.base_url or gateway_base_url(get_settings())).rstrip("/")

    def client(self) -> openai.OpenAI:
        if self._client is None:
            if not self.api_key:
                raise CliError(
                    "no API key: pass --api-key or set TUNELOOP_API_KEY "
                    "(`tuneloop keys create --tenant <id>` prints one)",
                    USAGE,
                )
            self._client = openai.OpenAI(
                base_url=self.url(),
                api_key=self.api_key,
                timeout=TIMEOUT_S,
                max_retries=MAX_RETRIES,
            )
        return self._client


def gateway(ctx: typer.Context) -> openai.OpenAI:
    """The SDK client of the command's root options (click passes `obj` down to every group)."""
    obj = ctx.find_root().obj
    if not isinstance(obj, Gateway):
        raise CliError("the CLI was started without its root options", USAGE)
    return obj.client()


def part(value: str) -> str:
    """A path segment as given by the user (an id), escaped so it stays one segment."""
    return quote(value, safe="")


def get_json(client: openai.OpenAI, path: str, **params: Any) -> dict[str, Any]:
    """GET one of tuneloop's own routes (no SDK resource) as a dict; None params are left out."""
    query = {name: value for name, value in params.items() if value is not None}
    return client.get(path, cast_to=dict[str, Any], options={"params": query})


def post_json(
    client: openai.OpenAI, path: str, body: dict[str, Any] | None = None
) -> dict[str, Any]:
    return client.post(path, cast_to=dict[str, Any], body=body)


def delete_json(client: openai.OpenAI, path: str) -> dict[str, Any]:
    return client.delete(path, cast_to=dict[str, Any])


def pages(client: openai.OpenAI, path: str, *, limit: int, **params: Any) -> list[dict[str, Any]]:
    """Up to `limit` objects of an OpenAI-style list (`data`, `has_more`, `after` the last id)."""
    found: list[dict[str, Any]] = []
    after: str | None = None
    while len(found) < limit:
        page = get_json(client, path, limit=min(100, limit - len(found)), after=after, **params)
        data = page.get("data") or []
        found.extend(data)
        if not page.get("has_more") or not data:
            break
        after = str(data[-1]["id"])
    return found

"""How a `tuneloop` command fails: one line on stderr (the server's message and HTTP status, or
why the stack could not be reached), never a traceback, and an exit code a script can test.

The codes (docs/cli.md): 0 done; 1 the API refused (4xx, or a 500); 2 usage (bad options, no
API key, invalid settings); 3 the stack cannot be reached (no answer, or a 502/503/504: a
service behind the gateway is away); 4 done, but the work did not end well (an upload with
rejected lines, a failed build, a job that failed or was cancelled); 130 interrupted (Ctrl-C).
"""

from __future__ import annotations

from typing import Any, NoReturn

import openai
import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup

from shared.settings import SettingsError

OK = 0
API_ERROR = 1
USAGE = 2
UNREACHABLE = 3
NOT_OK = 4
INTERRUPTED = 130
# A service behind the gateway is away (the relay's 503 names it) or the gateway is overloaded.
_AWAY = frozenset({502, 503, 504})

err = Console(stderr=True)


class CliError(Exception):
    """A failure the user can act on, with the exit code it ends the command with."""

    def __init__(self, message: str, code: int = API_ERROR) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def fail(message: str, code: int) -> NoReturn:
    """Print `error: message` as one unwrapped line and exit with `code`."""
    err.print(f"[red]error:[/] {escape(message)}", soft_wrap=True, highlight=False)
    raise typer.Exit(code)


def _field_errors(detail: list[Any]) -> str:
    """FastAPI's 422 list as `body.source.modle: Extra inputs are not permitted; ...`."""
    parts = []
    for item in detail:
        if isinstance(item, dict):
            where = ".".join(str(part) for part in item.get("loc", []))
            parts.append(f"{where}: {item.get('msg', item)}" if where else str(item.get("msg")))
        else:
            parts.append(str(item))
    return "; ".join(parts)


def server_message(exc: openai.APIStatusError) -> str:
    """What the server said: OpenAI's `error.message`, else FastAPI's `detail`. The SDK's `body`
    is the `error` object when the answer has one, the whole body otherwise."""
    body = exc.body
    if isinstance(body, dict):
        message = body.get("message")
        if isinstance(message, str) and message:
            return message
        detail = body.get("detail")
        if isinstance(detail, str) and detail:
            return detail
        if isinstance(detail, list) and detail:
            return _field_errors(detail)
    if isinstance(body, str) and body.strip():
        return body.strip()
    return exc.response.reason_phrase or "no message"


def describe(exc: Exception) -> tuple[str, int]:
    """The one line and the exit code for an exception a command may raise."""
    if isinstance(exc, CliError):
        return exc.message, exc.code
    if isinstance(exc, SettingsError):
        return str(exc), USAGE
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        return (
            f"{server_message(exc)} (HTTP {status})",
            UNREACHABLE if status in _AWAY else API_ERROR,
        )
    if isinstance(exc, openai.APIConnectionError):
        url = exc.request.url
        cause = exc.__cause__ or exc.__context__
        why = exc.message if cause is None else str(cause) or type(cause).__name__
        where = f"{url.scheme}://{url.netloc.decode()}"
        return f"cannot reach the gateway at {where} ({why}); is the stack up?", UNREACHABLE
    if isinstance(exc, openai.APIError):
        return exc.message, API_ERROR
    raise exc


class CliGroup(TyperGroup):
    """The root group: every command it runs that raises a known error ends as `fail` says."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except (CliError, SettingsError, openai.APIError) as exc:
            message, code = describe(exc)
            fail(message, code)

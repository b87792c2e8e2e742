"""What the CLI prints with: the console, tables, and the few formats every command shares."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

out = Console()
# Columns that hold ids are copied from: never wrapped or cut, the other columns give way.
ID_COLUMNS = frozenset({"id", "job", "file", "dataset", "deployment", "model", "version", "run"})


def table(
    title: str, columns: Sequence[str], rows: Iterable[Sequence[object]], *, header: bool = True
) -> Table:
    """A table whose cells are shown as text (never read as rich markup: they are the server's)."""
    shown = Table(title=title, title_justify="left", show_header=header)
    for column in columns:
        kept = column in ID_COLUMNS
        shown.add_column(column, no_wrap=kept, overflow="fold", min_width=None if kept else 4)
    for row in rows:
        shown.add_row(*(escape(text(cell)) for cell in row))
    return shown


def fields(title: str, pairs: Iterable[tuple[str, object]]) -> Table:
    """A two-column table of an object's fields, leaving out those that are unset."""
    kept = ((k, v) for k, v in pairs if v not in (None, "", []))
    return table(title, ("field", "value"), kept, header=False)


def text(value: object) -> str:
    """A cell: '-' for nothing, numbers to 4 significant digits, objects as compact JSON."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return str(value)


def when(unix: int | float | None) -> str:
    """A unix time as local date and time to the second; '-' when there is none."""
    if not unix:
        return "-"
    return datetime.fromtimestamp(unix).strftime("%Y-%m-%d %H:%M:%S")


def duration(seconds: float | None) -> str:
    if seconds is None or seconds < 0:
        return "-"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


def short(value: object, width: int = 60) -> str:
    """One line of at most `width` characters (newlines shown as spaces)."""
    line = " ".join(text(value).split())
    return line if len(line) <= width else line[: width - 1] + "…"


def counts(reasons: dict[str, Any] | None) -> str:
    """`{"near_dup": 3, "empty": 1}` as `near_dup 3, empty 1`, largest first."""
    if not reasons:
        return "-"
    ranked = sorted(reasons.items(), key=lambda item: (-float(item[1]), item[0]))
    return ", ".join(f"{name} {number}" for name, number in ranked)

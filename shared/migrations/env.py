"""Alembic environment: the metadata of every table module, and a connection from shared.db.

`shared.db.migrate()` hands in an open connection; `python -m shared.db revision` hands in a URL.
Offline mode (`--sql`) renders SQL for the URL without connecting.
"""

from __future__ import annotations

from typing import Any, Literal

from alembic import context
from alembic.autogenerate.api import AutogenContext
from sqlalchemy.engine import URL, Connection
from sqlmodel import SQLModel
from sqlmodel.sql.sqltypes import AutoString

from shared.db import UTCDateTime, import_table_modules, make_engine
from shared.settings import get_settings

config = context.config
# The kernel's tables and those each service registers (pyproject.toml, shared.db.TABLES_GROUP).
import_table_modules()
target_metadata = SQLModel.metadata


def render_item(type_: str, obj: Any, autogen_context: AutogenContext) -> str | Literal[False]:
    """Render our column types as plain SQLAlchemy, so migrations never import application code."""
    if type_ == "type" and isinstance(obj, UTCDateTime):
        return "sa.DateTime(timezone=True)"
    if type_ == "type" and isinstance(obj, AutoString):
        return f"sa.String(length={obj.length})" if obj.length else "sa.String()"
    return False


def _configure(**kwargs: Any) -> None:
    context.configure(
        target_metadata=target_metadata,
        render_item=render_item,
        compare_type=True,
        **kwargs,
    )


def _run_online(connection: Connection) -> None:
    # SQLite can't ALTER most things; batch mode rebuilds the table instead.
    _configure(connection=connection, render_as_batch=connection.dialect.name == "sqlite")
    with context.begin_transaction():
        context.run_migrations()


def _url() -> str | URL:
    # Kept a URL object: str(URL) would mask the password.
    url: URL | None = config.attributes.get("url")
    return url if url is not None else get_settings().database_url


def run() -> None:
    if context.is_offline_mode():
        url = _url()
        _configure(url=url, literal_binds=True, dialect_opts={"paramstyle": "named"})
        with context.begin_transaction():
            context.run_migrations()
        return
    connection = config.attributes.get("connection")
    if connection is not None:
        _run_online(connection)
        return
    engine = make_engine(_url())
    try:
        with engine.begin() as new_connection:
            _run_online(new_connection)
    finally:
        engine.dispose()


run()

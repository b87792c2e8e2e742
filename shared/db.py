"""SQL kernel for every service: engines, sessions, readiness wait, Alembic migrations and a CLI.

SQLite (one file under the data dir, shared by several processes) by default; PostgreSQL when
DATABASE_URL says so. Schema changes go through the migrations in shared/migrations, never
through `create_all`. `python -m shared.db upgrade` migrates before services start.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from importlib.metadata import entry_points
from pathlib import Path
from typing import Annotated, Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from fastapi import Depends, Request
from sqlalchemy import Dialect, event, text
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.exc import InterfaceError, OperationalError, SQLAlchemyError
from sqlalchemy.pool import StaticPool
from sqlalchemy.types import DateTime, TypeDecorator
from sqlmodel import Session, SQLModel, create_engine
from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_exponential

from shared.settings import SettingsError, get_settings

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
# The kernel's own tables; a service registers the module holding its own under this entry-point
# group (pyproject.toml), so Alembic sees them all without shared naming any service.
KERNEL_TABLES = ("shared.auth", "shared.signing")
TABLES_GROUP = "tuneloop.tables"
SQLITE_BUSY_TIMEOUT_MS = 5_000
POSTGRES_CONNECT_TIMEOUT_S = 10
_LOCK_KEY = 0x74756E656C6F6F70  # "tuneloop": the PostgreSQL advisory lock migrations hold

# Deterministic constraint names: Alembic can only drop or alter a constraint it can name, and
# SQLite's batch mode rebuilds tables by name. Table modules import this module before defining
# tables, so the convention is in place when their constraints are created.
SQLModel.metadata.naming_convention = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

log = logging.getLogger(__name__)


class DatabaseUnavailableError(RuntimeError):
    """The database did not answer in time; the message names where it was looked for."""


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes on every backend (SQLite stores no zone, would return naive ones)."""

    impl = DateTime
    cache_ok = True

    def __init__(self) -> None:
        super().__init__(timezone=True)

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value.isoformat()} refused: pass an aware UTC time")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


# --- engines and sessions ---------------------------------------------------------------------


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    try:
        # WAL lets readers in other processes carry on while one process writes.
        cursor.execute("PRAGMA journal_mode=WAL")
        # SQLite ignores foreign keys unless each connection asks for them.
        cursor.execute("PRAGMA foreign_keys=ON")
        # Wait for another process's write lock rather than fail at once with "database is locked".
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    finally:
        cursor.close()


def make_engine(url: str | URL | None = None, *, echo: bool = False) -> Engine:
    """An engine for `url` (default: DATABASE_URL, else the SQLite file in the data dir)."""
    if url is None:
        settings = get_settings()
        url, echo = settings.database_url, echo or settings.db.echo
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        connect_args: dict[str, Any] = {}
        if (
            parsed.get_driver_name() in ("psycopg", "psycopg2")
            and "connect_timeout" not in parsed.query
        ):
            # Without it an unroutable host hangs for the OS TCP timeout (minutes).
            connect_args["connect_timeout"] = POSTGRES_CONNECT_TIMEOUT_S
        return create_engine(parsed, echo=echo, pool_pre_ping=True, connect_args=connect_args)
    extra: dict[str, Any] = {}
    if parsed.database in (None, "", ":memory:"):
        # One shared connection, or every checkout would see its own empty database.
        extra["poolclass"] = StaticPool
    else:
        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
    # FastAPI runs sync dependencies in a thread pool, so connections move between threads.
    engine = create_engine(parsed, echo=echo, connect_args={"check_same_thread": False}, **extra)
    event.listen(engine, "connect", _sqlite_pragmas)
    return engine


@contextmanager
def session_scope(engine: Engine) -> Iterator[Session]:
    """A session that commits when the block succeeds and rolls back when it raises.

    Objects stay readable after the block (expire_on_commit=False), since callers usually
    return what they loaded.
    """
    with Session(engine, expire_on_commit=False) as session:
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise


async def get_engine(request: Request) -> Engine:
    """FastAPI dependency: the engine an app keeps on `app.state.db_engine` (set in its lifespan).
    Async only so that FastAPI calls it on the event loop: a plain `def` dependency is run in
    its thread pool, a thread hand-off per request for one attribute read.

    Tests may instead override this dependency (`app.dependency_overrides[get_engine]`).
    """
    engine = getattr(request.app.state, "db_engine", None)
    if not isinstance(engine, Engine):
        raise RuntimeError(
            "app.state.db_engine is not set: create it with make_engine() in the lifespan"
        )
    return engine


def get_session(engine: Annotated[Engine, Depends(get_engine)]) -> Iterator[Session]:
    """FastAPI dependency: one session per request; routes (or crud functions) commit explicitly."""
    with Session(engine) as session:
        yield session


SessionDep = Annotated[Session, Depends(get_session)]


# --- readiness --------------------------------------------------------------------------------


def describe(url: URL) -> str:
    """Where a database lives, for error messages: host and database, never the password."""
    if url.get_backend_name() == "sqlite":
        return f"SQLite file {url.database or ':memory:'}"
    port = f":{url.port}" if url.port else ""
    return f"{url.get_backend_name()} at {url.host or 'localhost'}{port}/{url.database or ''}"


def _one_line(exc: BaseException, password: str | None) -> str:
    cause = getattr(exc, "orig", None) or exc
    lines = str(cause).strip().splitlines()
    line = lines[0].strip() if lines else type(cause).__name__
    return line.replace(password, "***") if password else line


def wait_until_ready(engine: Engine, timeout_s: float = 30.0) -> None:
    """Return once the database answers `SELECT 1`; DatabaseUnavailableError after timeout_s."""

    def ping() -> None:
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))

    retrying = Retrying(
        stop=stop_after_delay(timeout_s),
        wait=wait_exponential(multiplier=0.1, max=2.0),
        retry=retry_if_exception_type((OperationalError, InterfaceError)),
        reraise=True,
    )
    try:
        retrying(ping)
    except SQLAlchemyError as exc:
        reason = _one_line(exc, engine.url.password)
        raise DatabaseUnavailableError(
            f"database {describe(engine.url)} not ready after {timeout_s:g}s: {reason}"
        ) from None


# --- migrations -------------------------------------------------------------------------------


def registered_table_modules() -> dict[str, str]:
    """name -> module of every table module registered under TABLES_GROUP (a service each)."""
    return {point.name: point.value for point in entry_points(group=TABLES_GROUP)}


def import_table_modules() -> list[str]:
    """Import every module that defines tables, so SQLModel.metadata holds them all: the kernel's
    and those the services register. None registered means an install that predates the
    registrations: autogenerate would then see every service table as gone, so it is refused."""
    registered = registered_table_modules()
    if not registered:
        raise RuntimeError(
            f"no table modules registered under the entry-point group {TABLES_GROUP!r}: "
            "reinstall the project (make install)"
        )
    modules = [*KERNEL_TABLES, *registered.values()]
    for module in modules:
        importlib.import_module(module)
    return modules


def alembic_config(url: str | URL | None = None) -> Config:
    """Alembic's config, built in code: no alembic.ini to keep in step with settings."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("file_template", "%%(year)d%%(month).2d%%(day).2d_%%(rev)s_%%(slug)s")
    if url is not None:
        # An attribute, not an ini option: '%' in an encoded password would break interpolation.
        config.attributes["url"] = make_url(url)
    return config


def _sqlite_migration_mode(dbapi_connection: Any, _record: Any) -> None:
    # Runs after _sqlite_pragmas. Batch migrations rebuild a table by dropping it, and dropping a
    # parent table with foreign keys on cascade-deletes its children's rows. The pragma can only
    # change outside a transaction, hence here; the keys are checked before commit instead.
    dbapi_connection.execute("PRAGMA foreign_keys=OFF")
    # Let SQLAlchemy's "begin" event issue BEGIN IMMEDIATE instead of pysqlite's lazy BEGIN.
    dbapi_connection.isolation_level = None


def _sqlite_begin_immediate(connection: Connection) -> None:
    connection.exec_driver_sql("BEGIN IMMEDIATE")


@contextmanager
def migration_connection(url: str | URL | None = None) -> Iterator[Connection]:
    """A connection holding one transaction, set up for schema changes.

    Processes that migrate at start-up take turns (PostgreSQL advisory lock; SQLite's write
    lock, taken at BEGIN IMMEDIATE), and a failed migration rolls back on both backends.
    """
    engine = make_engine(url)
    sqlite = engine.dialect.name == "sqlite"
    if sqlite:
        event.listen(engine, "connect", _sqlite_migration_mode)
        event.listen(engine, "begin", _sqlite_begin_immediate)
    try:
        with engine.begin() as connection:
            if engine.dialect.name == "postgresql":
                connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _LOCK_KEY})
            yield connection
            if sqlite:
                broken = connection.exec_driver_sql("PRAGMA foreign_key_check").all()
                if broken:
                    raise RuntimeError(f"migration left rows breaking foreign keys: {broken[:5]}")
    finally:
        engine.dispose()


def _run_alembic(url: str | URL | None, action: Callable[[Config], None]) -> None:
    with migration_connection(url) as connection:
        config = alembic_config()
        config.attributes["connection"] = connection
        action(config)


def migrate(url: str | URL | None = None, *, revision: str = "heads") -> None:
    """`alembic upgrade` (to every head, so branches added by separate services all apply)."""
    _run_alembic(url, lambda config: command.upgrade(config, revision))


def downgrade(url: str | URL | None = None, *, revision: str) -> None:
    _run_alembic(url, lambda config: command.downgrade(config, revision))


def current_revisions(url: str | URL | None = None) -> set[str]:
    """The revisions the database is at (empty before the first migration)."""
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            return set(MigrationContext.configure(connection).get_current_heads())
    finally:
        engine.dispose()


def head_revisions() -> set[str]:
    return set(ScriptDirectory.from_config(alembic_config()).get_heads())


# --- CLI --------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m shared.db", description="tuneloop database tools"
    )
    parser.add_argument(
        "--url", help="database URL (default: DATABASE_URL or the data dir's SQLite)"
    )
    parser.add_argument(
        "--timeout", type=float, default=30.0, help="seconds to wait for the database"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("upgrade", help="apply every migration")
    sub.add_parser("current", help="print the applied revision(s) and whether they are the head")
    down = sub.add_parser("downgrade", help="revert to a revision ('base' empties the schema)")
    down.add_argument("revision")
    rev = sub.add_parser("revision", help="write a new migration file")
    rev.add_argument("-m", "--message", required=True)
    rev.add_argument(
        "--autogenerate", action="store_true", help="diff the models against the database"
    )
    return parser


def _add_ruff_hooks(config: Config) -> None:
    hooks = {"ruff_fix": "check --fix --exit-zero --quiet", "ruff_format": "format --quiet"}
    config.set_section_option("post_write_hooks", "hooks", ", ".join(hooks))
    for name, ruff_args in hooks.items():
        config.set_section_option("post_write_hooks", f"{name}.type", "module")
        config.set_section_option("post_write_hooks", f"{name}.module", "ruff")
        config.set_section_option(
            "post_write_hooks", f"{name}.options", f"{ruff_args} REVISION_SCRIPT_FILENAME"
        )


def _run_command(args: argparse.Namespace, url: str) -> None:
    if args.command == "upgrade":
        migrate(url)
        print(f"database at {', '.join(sorted(current_revisions(url)))} (head)")
    elif args.command == "current":
        current, heads = current_revisions(url), head_revisions()
        state = "head" if current == heads else f"behind; head is {', '.join(sorted(heads))}"
        print(f"{', '.join(sorted(current)) or 'empty (no migration applied)'} ({state})")
    elif args.command == "downgrade":
        downgrade(url, revision=args.revision)
    else:
        config = alembic_config(url)
        if importlib.util.find_spec("ruff") is not None:  # dev installs: new files come lint-clean
            _add_ruff_hooks(config)
        command.revision(config, message=args.message, autogenerate=args.autogenerate)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        url = args.url or get_settings().database_url
        engine = make_engine(url)
        try:
            wait_until_ready(engine, args.timeout)
        finally:
            engine.dispose()
        _run_command(args, url)
    except (DatabaseUnavailableError, SettingsError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
